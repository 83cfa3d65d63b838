"""`rlkit hub ...`: run a hub server and manage its API tokens."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.ports import HUB_PORT

app = typer.Typer(help="Run a self-hosted environment hub.", no_args_is_help=True)
token_app = typer.Typer(help="Manage API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

DataOption = typer.Option(..., "--data", help="Directory for artifacts (and the SQLite db).")
DbOption = typer.Option(None, "--db", help="SQLAlchemy URL (default sqlite:///DATA/hub.db).")


@app.command("serve")
def serve_cmd(
    data: Path = DataOption,
    db: str | None = DbOption,
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(HUB_PORT, min=1, max=65535, help="Port to bind."),
    max_upload_mb: float = typer.Option(50.0, help="Largest accepted upload request, in MB."),
) -> None:
    """Serve the package index, upload API, JSON API and web pages."""
    from rlkit.errors import UsageError
    from rlkit.hub.server.app import serve

    if max_upload_mb <= 0:  # typer has no open interval bound
        raise UsageError("--max-upload-mb must be positive")
    serve(data, db, host=host, port=port, max_upload_mb=max_upload_mb)


@token_app.command("create")
def token_create_cmd(
    data: Path = DataOption,
    owner: str = typer.Option(..., "--owner", help="Namespace the token may publish into."),
    db: str | None = DbOption,
) -> None:
    """Create an API token and print it (only its hash is stored)."""
    from rlkit.hub.server.db import create_token, default_db_url, make_engine

    data.mkdir(parents=True, exist_ok=True)
    print(create_token(make_engine(db or default_db_url(data)), owner))
