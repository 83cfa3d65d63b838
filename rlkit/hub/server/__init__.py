"""The self-hosted hub server (`rlkit hub serve`): FastAPI app, SQLAlchemy store, web pages."""
