"""`rlkit sandbox ...`: inspect the untrusted-code sandbox on this machine."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Inspect the untrusted-code sandbox.", no_args_is_help=True)


@app.command("check")
def check_cmd() -> None:
    """Run adversarial probes inside a real sandbox and print what is isolated here.

    Exits 1 when the sandbox cannot start or any property does not hold.
    """
    from rlkit.sandbox.check import check

    findings = asyncio.run(check())
    table = Table("property", "isolated", "detail", title="rlkit sandbox check")
    for finding in findings:
        mark = "[green]yes[/]" if finding.ok else "[bold red]NO[/]"
        table.add_row(finding.name, mark, finding.detail)
    Console().print(table)
    if not all(f.ok for f in findings):
        raise typer.Exit(1)
