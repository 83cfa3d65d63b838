"""`rlkit train` roles as separate processes: their commands, process trees, health and cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from rlkit.inference import InferenceClient
from rlkit.inference.admin import AdminClient
from rlkit.protocol.credentials import read_token
from tests.helpers import bench_children
from tests.helpers.cli import tiny_train_cmd

STEPS = 3


def train_cmd(model: Path, run_dir: Path, *extra: str) -> list[str]:
    return tiny_train_cmd(
        model,
        run_dir,
        "--log.plot=false",
        f"--orchestrator.max_steps={STEPS}",
        "--orchestrator.schedulers.c3po.capacity=16",  # two groups of 8 in flight: one per server
        "--orchestrator.schedulers.c3po.token_budget=128",
        "--orchestrator.drop_zero_advantage=false",  # an untrained model solves nothing
        "--orchestrator.eval.at_start=false",
        "--ckpt.interval=0",
        *extra,
    )


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    return set(bench_children.descendants(pid, bench_children.children())) - {pid}


def process_environ(pid: int) -> dict[str, str]:
    """The environment `pid` started with (from /proc)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(v.split("=", 1) for v in raw.split("\0") if "=" in v)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def wait_exit(
    procs: list[subprocess.Popen], seen: set[int], timeout: float, logs: list[Path]
) -> None:
    """Wait for every process in `procs`, collecting their descendants into `seen`."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        for p in procs:
            seen |= descendants(p.pid)
        if time.monotonic() > deadline:
            tails = "\n".join(f"== {log}\n{log.read_text()[-2000:]}" for log in logs)
            raise AssertionError(f"no exit after {timeout}s:\n{tails}")
        time.sleep(0.5)


def wait_healthy(url: str, proc: subprocess.Popen, seen: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        seen |= descendants(proc.pid)
        assert proc.poll() is None, f"inference role exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} not healthy after {timeout}s"
        time.sleep(0.5)


def status(url: str, token_file: Path) -> dict:
    """The server's /rlkit/status, asked with the token in `token_file` (a run's `token`)."""

    async def get() -> dict:
        async with InferenceClient(url, api_key=read_token(token_file), max_retries=0) as client:
            return await AdminClient(client).status()

    return asyncio.run(get())


def steps_logged(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]


def kill_all(procs: list[subprocess.Popen], seen: set[int]) -> None:
    """Cleanup after a failure: only our own process groups and recorded pids."""
    for p in procs:
        if p.poll() is None:
            seen |= descendants(p.pid)
            os.killpg(p.pid, signal.SIGKILL)
    for pid in seen:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
