"""Several sandbox services for one client (issue 64): requests spread over them, a program
whose service died runs on another, a session on a dead service is reported lost (never a
hang), and `rlkit sandbox serve --status` shows each one's load."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit import sandbox
from rlkit.sandbox import runner
from rlkit.sandbox.session import PythonSession
from tests.helpers.sandbox_service import sandbox_service

pytestmark = [pytest.mark.system, pytest.mark.slow]


async def test_two_services_share_the_work_and_survive_one_killed(tmp_path: Path) -> None:
    args = ["--pool-size", "1", "--concurrency", "2"]
    with sandbox_service(tmp_path, *args) as first, sandbox_service(tmp_path, *args) as second:
        runner.configure(url=f"{first.url},{second.url}", token_file=str(first.token_file))
        try:
            results = await asyncio.gather(
                *[sandbox.run("import time; time.sleep(0.2); print(1)") for _ in range(8)]
            )
            assert [r.stdout for r in results] == ["1\n"] * 8
            assert first.metrics()["runs"] > 0 and second.metrics()["runs"] > 0
            status = subprocess.run(
                [sys.executable, "-m", "rlkit_cli.main", "sandbox", "serve"]
                + ["--status", f"{first.url},{second.url}", "--token-file", str(first.token_file)],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "COLUMNS": "200"},
            )
            assert status.returncode == 0 and first.url in status.stdout, status.stderr
            session = PythonSession()
            assert (await session.execute("x = 1")).status == "ok"
            home = session._remote.base  # the service holding the session's interpreter
            victim = first if home == first.url else second
            victim.proc.kill()
            victim.proc.wait()
            began = time.monotonic()
            moved = await asyncio.gather(*[sandbox.run("print(2)") for _ in range(4)])
            assert [r.stdout for r in moved] == ["2\n"] * 4, [r.stderr for r in moved]
            cell = await session.execute("x")
            assert cell.status == "sandbox_error" and session.lost and home in session.lost
            assert time.monotonic() - began < 20
            await session.close()
            down = subprocess.run(
                [sys.executable, "-m", "rlkit_cli.main", "sandbox", "serve"]
                + ["--status", first.url, "--status", second.url]
                + ["--token-file", str(first.token_file)],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "COLUMNS": "200"},
            )
            assert down.returncode == 1 and "down" in down.stdout
        finally:
            runner.configure(url="")
