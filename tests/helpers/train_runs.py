"""`rlkit train` runs for the integration tests, with their test environments on RLKIT_ENV_PATH:
one in the foreground (`run`, with the custom losses and the faulty transports importable), one
in the background (`start`), and its logged steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.cli import default_sigint
from tests.helpers.roles import descendants, kill_all

ENV_PATH = str(Path(__file__).parents[1] / "integration" / "envs")
CUSTOM_LOSSES = str(Path(__file__).parents[1] / "integration" / "custom_losses")
# transports that fail on purpose (`faulty_transports`), for the runs that need a fault
FAULT_PLUGINS = str(Path(__file__).parents[1] / "integration" / "fault_plugins")
# two steps, no evals, no plot: the shortest run that still trains
SHORT = [
    "--orchestrator.max_steps=2",
    "--orchestrator.eval.at_start=false",
    "--orchestrator.eval.at_end=false",
    "--log.plot=false",
]


def run(cmd: list[str], log: Path, timeout: float = 900) -> int:
    """Run `cmd` to the end with its output in `log`; return its exit code."""
    env = {
        **os.environ,
        "RLKIT_ENV_PATH": ENV_PATH,
        "PYTHONPATH": os.pathsep.join(
            [CUSTOM_LOSSES, FAULT_PLUGINS, os.environ.get("PYTHONPATH", "")]
        ),
    }
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    return proc.returncode


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "RLKIT_ENV_PATH": ENV_PATH}
    return subprocess.Popen(
        cmd,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=default_sigint,
    )


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float) -> int:
    """Wait until a step >= `step` is logged; return the last step logged."""
    deadline = time.monotonic() + timeout
    while not (logged := [r["step"] for r in records(run_dir)]) or max(logged) < step:
        assert proc.poll() is None, f"run exited early with {proc.returncode}"
        assert time.monotonic() < deadline, f"no step {step} after {timeout}s"
        time.sleep(0.2)
    return max(logged)


def run_killing_the_server(cmd: list[str], log: Path, run_dir: Path, after_step: int) -> int:
    """Run `cmd` (a run with one inference server) in the background, SIGKILL that server's
    process tree (API process and engine core) once step `after_step` is logged, and return
    the run's exit code."""
    proc = start(cmd, log)
    seen: set[int] = set()
    try:
        wait_for_step(proc, run_dir, after_step, timeout=600)
        (server,) = json.loads((run_dir / "pids.json").read_text())["inference"]
        tree = [server, *descendants(server)]
        seen |= set(tree)
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        return proc.wait(timeout=600)
    finally:
        kill_all([proc], seen)
