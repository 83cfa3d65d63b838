"""`rlkit runs ...`: inspect training run directories."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Inspect training run directories.", no_args_is_help=True)


@app.command("audit")
def audit_cmd(
    run_dir: Path = typer.Argument(..., help="A run's log.run_dir."),
) -> None:
    """Check that every step ran once and every prompt handed out was trained exactly once.

    Reads the batch files, metrics and orchestrator states; exits 1 on any violation.
    """
    from rlkit.runs.audit import audit_run

    report = audit_run(run_dir)
    for line in report.lines():
        typer.echo(line)
    if not report.ok:
        raise typer.Exit(1)
