"""`rlkit hub ...`: run a hub server and manage its API tokens."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.ports import HUB_PORT
from rlkit.progress import make_console

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
    verify_tolerance: float = typer.Option(
        0.05, min=0.0, help="A re-run verifies a result when its mean reward is this close."
    ),
) -> None:
    """Serve the package index, upload API, JSON API and web pages."""
    from rlkit.errors import UsageError
    from rlkit.hub.server.app import serve

    if max_upload_mb <= 0:  # typer has no open interval bound
        raise UsageError("--max-upload-mb must be positive")
    serve(
        data,
        db,
        host=host,
        port=port,
        max_upload_mb=max_upload_mb,
        verify_tolerance=verify_tolerance,
    )


def _engine(data: Path, db: str | None):  # noqa: ANN202 - sqlalchemy imported lazily
    from rlkit.hub.server.db import default_db_url, make_engine

    data.mkdir(parents=True, exist_ok=True)
    return make_engine(db or default_db_url(data))


@token_app.command("create")
def token_create_cmd(
    data: Path = DataOption,
    owner: str = typer.Option(..., "--owner", help="Namespace the token may publish into."),
    db: str | None = DbOption,
    expires_days: float | None = typer.Option(
        None, "--expires-days", help="Refuse the token after this many days [never]."
    ),
    trusted_runner: bool = typer.Option(
        False, "--trusted-runner", help="The token may verify any environment's results."
    ),
) -> None:
    """Create an API token and print it (only its hash is stored)."""
    from datetime import timedelta

    from rlkit.errors import UsageError
    from rlkit.hub.server.db import create_token

    if expires_days is not None and expires_days <= 0:
        raise UsageError("--expires-days must be positive")
    expires = timedelta(days=expires_days) if expires_days is not None else None
    print(create_token(_engine(data, db), owner, expires, trusted_runner))


@token_app.command("revoke")
def token_revoke_cmd(
    token: str | None = typer.Argument(None, help="The token to revoke (or use --id)."),
    data: Path = DataOption,
    db: str | None = DbOption,
    token_id: int | None = typer.Option(None, "--id", help="Revoke by id (see `token list`)."),
) -> None:
    """Revoke a token: every later request carrying it gets 401 "API token revoked"."""
    from rlkit.hub.server.db import revoke_token

    owner = revoke_token(_engine(data, db), token, token_id)
    print(f"revoked a token of {owner}")


@token_app.command("list")
def token_list_cmd(data: Path = DataOption, db: str | None = DbOption) -> None:
    """List tokens: id, owner, role, created, expires, revoked (tokens themselves are not
    stored, so they cannot be shown)."""
    from rich.table import Table

    from rlkit.hub.server.db import list_tokens

    table = Table("id", "owner", "trusted runner", "created", "expires", "revoked")
    for row in list_tokens(_engine(data, db)):
        table.add_row(
            str(row["id"]),
            row["owner"],
            "yes" if row["trusted_runner"] else "",
            row["created"],
            row["expires"] or "never",
            row["revoked"] or "",
        )
    make_console().print(table)
