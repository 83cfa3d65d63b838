"""`rlkit sandbox ...`: inspect the untrusted-code sandbox on this machine, or serve it."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import typer
from rich.table import Table

from rlkit.ports import SANDBOX_PORT
from rlkit.progress import make_console

app = typer.Typer(help="Inspect or serve the untrusted-code sandbox.", no_args_is_help=True)


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
    make_console().print(table)
    if not all(f.ok for f in findings):
        raise typer.Exit(1)


def _profile(text: str) -> tuple[float, int]:
    timeout, _, memory = text.partition(":")
    try:
        return float(timeout), int(memory)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected TIMEOUT_S:MEMORY_MB, e.g. 30:512") from None


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(SANDBOX_PORT, help="TCP port."),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="Token file (mode 0600) clients must present [$RLKIT_HOME/sandbox/PORT/token, "
        "created].",
    ),
    tenant: list[str] = typer.Option(
        [], "--tenant", help="A client with its own token file and sessions (repeatable)."
    ),
    profile: list[str] = typer.Option(
        [],
        "--profile",
        help="A warm pool's limits, TIMEOUT_S:MEMORY_MB (repeatable); requests may ask for "
        "less, never more than the largest. Default: 60:1024, what every shipped environment "
        "asks at most.",
    ),
    pool_size: int = typer.Option(4, min=0, help="Warm sandboxes kept ready per profile."),
    concurrency: int = typer.Option(4, min=1, help="Programs and cells running at once."),
    queue: int = typer.Option(256, min=0, help="Requests waiting for a slot; more get 429."),
    session_idle_s: float = typer.Option(300.0, min=1, help="Close sessions unused this long."),
    max_sessions: int = typer.Option(256, min=1, help="Open sessions at most."),
    max_sessions_per_caller: int = typer.Option(
        32, min=1, help="Open sessions at most for one caller (token)."
    ),
    backend: str | None = typer.Option(None, help="Sandbox backend [bwrap]."),
    fork_server: bool = typer.Option(
        True,
        help="Fork each warm sandbox from a fork server (fresh namespaces, tmpfs and process "
        "per request; bwrap only) instead of starting bubblewrap and an interpreter for each.",
    ),
    max_session_cpu_s: float = typer.Option(
        600.0, min=1, help="CPU seconds a session may use over its whole life, at most."
    ),
    status: list[str] = typer.Option(
        [],
        "--status",
        help="Serve nothing: show the load of each service URL given (repeatable, or "
        "comma-separated), with --token-file or $RLKIT_SANDBOX_TOKEN_FILE.",
    ),
) -> None:
    """Serve the sandbox over HTTP: warm pools, a shared concurrency limit, sessions, metrics.

    Every route but /health needs the token in the printed token file; clients set
    `[sandbox] url = "http://HOST:PORT"` and `token_file` (or RLKIT_SANDBOX_URL and
    RLKIT_SANDBOX_TOKEN_FILE); several services: `service_urls = [...]` (one token file).
    """
    if status:
        _show_status(status, token_file)
        return
    from rlkit.protocol.credentials import read_token
    from rlkit.sandbox.pool import Profile
    from rlkit.sandbox.runner import SandboxSettings
    from rlkit.sandbox.service import ServiceSettings, serve
    from rlkit.serving import Credentials, load_tenants, token_files

    here = SandboxSettings.from_env()  # the service runs its sandboxes itself: no url
    sandbox = replace(here, backend=backend or here.backend, url=None, token_file=None)
    if token_file is None:
        home = Path(os.environ.get("RLKIT_HOME") or "~/.rlkit").expanduser()
        token_file = home / "sandbox" / str(port) / "token"
    creds = token_files(token_file, tenant)
    credentials = Credentials(
        owner_token=read_token(creds.token_file), tenants=load_tenants(creds.tenants_dir)
    )
    config = ServiceSettings(
        profiles=tuple(Profile(*_profile(p)) for p in profile) or ServiceSettings().profiles,
        pool_size=pool_size,
        concurrency=concurrency,
        queue=queue,
        max_sessions=max_sessions,
        max_sessions_per_caller=max_sessions_per_caller,
        session_idle_s=session_idle_s,
        max_session_cpu_s=max_session_cpu_s,
        fork_server=fork_server,
        sandbox=sandbox,
    )
    typer.echo(f"sandbox service on http://{host}:{port}")
    typer.echo(f"token file: {creds.token_file}")
    for name, path in creds.tenant_files.items():
        typer.echo(f"tenant {name}: {path}")
    serve(host, port, credentials, config)


def _show_status(urls: list[str], token_file: Path | None) -> None:
    """One row per service: its load from /metrics, or why it did not answer (exit 1 if any)."""
    import httpx

    from rlkit.protocol.credentials import read_token
    from rlkit.sandbox.client import service_urls

    token_path = token_file or os.environ.get("RLKIT_SANDBOX_TOKEN_FILE")
    if not token_path:
        raise typer.BadParameter("--status needs --token-file (or RLKIT_SANDBOX_TOKEN_FILE)")
    headers = {"Authorization": f"Bearer {read_token(token_path)}"}
    table = Table(
        "service",
        "running",
        "waiting",
        "ready",
        "sessions",
        "programs",
        "cells",
        "refused",
        title="rlkit sandbox services",
    )
    down = 0
    for url in [u for text in urls for u in service_urls(text)]:
        try:
            m = httpx.get(f"{url}/metrics", headers=headers, timeout=5)
            m.raise_for_status()
            m = m.json()
        except (httpx.HTTPError, ValueError) as exc:
            down += 1
            table.add_row(url, f"[bold red]down[/] ({type(exc).__name__})", *[""] * 6)
            continue
        ready = sum(p["ready"] for p in m["pools"])
        size = sum(p["size"] for p in m["pools"])
        table.add_row(
            url,
            f"{m['running']}/{m['concurrency']}",
            f"{m['waiting']}/{m['queue']}",
            f"{ready}/{size}",
            str(m["sessions"]),
            str(m["runs"]),
            str(m["cells"]),
            str(m["rejected"]),
        )
    make_console().print(table)
    if down:
        raise typer.Exit(1)
