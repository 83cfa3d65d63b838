"""For benchmarks that run each variant in a fresh process: the child's JSON line, and the
process's memory figures from /proc/self/status."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def json_line_of(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict:
    """Run `cmd` to its end (an error raises) and parse the last line it printed."""
    done = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def status_kb(field: str) -> int:
    """A kB figure of this process (`VmRSS`, `VmHWM`, ...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")
