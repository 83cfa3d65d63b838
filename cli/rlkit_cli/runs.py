"""`rlkit runs ...`: look at and audit training runs from their run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.progress import make_console

app = typer.Typer(help="Look at and audit training runs.", no_args_is_help=True)


@app.command("show")
def show_cmd(
    run_dir: Path = typer.Argument(..., help="A training run's directory (its log.run_dir)."),
    html: Path | None = typer.Option(
        None, "--html", help="Also write a self-contained HTML report with the plots here."
    ),
    errors: bool = typer.Option(
        False, "--errors", help="Also print every errored rollout's full message, by cause."
    ),
) -> None:
    """Summarise a run: steps, reward sparkline, eval before/after, throughput, mismatch,
    errors and where the checkpoints are."""
    from rlkit.progress import print_line
    from rlkit.runs.rollout_errors import detail_lines
    from rlkit.runs.show import load_run, summary_lines, write_html

    run = load_run(run_dir)
    console = make_console()
    for line in summary_lines(run) + (detail_lines(run.errors) if errors else []):
        print_line(console, line)
    if html is not None:
        print_line(console, f"report: {write_html(run, html)}")


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
