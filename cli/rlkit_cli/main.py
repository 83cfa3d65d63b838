"""The `rlkit` command: a thin typer application that parses, validates and calls rlkit.*."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from rlkit.errors import UsageError

app = typer.Typer(
    name="rlkit",
    help="rlkit: environments, evaluation, a hub and an async RL trainer for language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = Console(stderr=True)


def _register() -> None:
    """Attach every sub-command module; each owns one verb or verb group."""
    from rlkit_cli import model

    app.add_typer(model.app, name="model")
    from rlkit_cli import infer

    app.command(name="infer", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        infer.infer
    )


_register()


def main() -> None:
    """Console-script entry point: UsageError becomes a message and exit code 2."""
    try:
        app(standalone_mode=False)
    except UsageError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        raise
