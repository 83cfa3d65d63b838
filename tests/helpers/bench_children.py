"""For benchmarks that run each variant in a fresh process: the child's JSON line, the process's
memory figures from /proc/self/status, and a process tree's peak memory from /proc."""

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


def children() -> dict[int, list[int]]:
    """Every process's children, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def high_water_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM) so far, 0 once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
