"""Interrupting `rlkit train` says how to continue, and `--resume` continues the saved run
(issue 45): SIGINT before the first checkpoint and SIGTERM after one each print one line with
the exact resume command; that command, run as printed, needs no override repeated (one that
changes something is named); resuming a finished run says so and starts nothing."""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import RLKIT, tiny_train_cmd
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import records, start

pytestmark = pytest.mark.slow

SHORT = [
    "--orchestrator.max_steps=3",
    "--ckpt.interval=1",
    "--trainer.weights.keep_last=3",
    "--orchestrator.eval.at_start=false",
    "--orchestrator.eval.at_end=false",
    "--log.plot=false",
]


def wait_for(proc: subprocess.Popen, log: Path, done, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.1)


def interrupt(proc: subprocess.Popen, log: Path, signum: int) -> str:
    proc.send_signal(signum)
    assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    lines = [line for line in log.read_text().splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, log.read_text()[-3000:]
    return lines[0]


def printed_command(line: str) -> list[str]:
    """The command a line ends with (`...: rlkit train X --resume`), runnable here."""
    words = shlex.split(line.split(": ")[-1])
    assert words[:2] == ["rlkit", "train"] and words[-1] == "--resume", line
    return [RLKIT, *words[1:]]


def run(cmd: list[str], log: Path) -> str:
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=600)
    assert done.returncode == 0, log.read_text()[-3000:]
    return log.read_text()


def test_interrupts_print_the_resume_command_and_resume_keeps_the_saved_config(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    logs = iter(tmp_path / f"log{i}" for i in range(5))
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        # Ctrl-C while the run starts: no checkpoint yet
        log = next(logs)
        proc = start(tiny_train_cmd(tiny_model_dir, run_dir, *SHORT, *urls), log)
        wait_for(proc, log, lambda: "trainer pid" in log.read_text(), "the trainer")
        line = interrupt(proc, log, signal.SIGINT)
        assert line.startswith("interrupted before the first checkpoint; start it again with: ")
        command = printed_command(line)
        assert command[2] == str(run_dir / "config.toml")

        # the printed command, as printed, continues the run; SIGTERM after a checkpoint
        log = next(logs)
        proc = start(command, log)
        ckpt = run_dir / "checkpoints" / "latest"
        wait_for(proc, log, ckpt.exists, "a checkpoint")
        line = interrupt(proc, log, signal.SIGTERM)
        newest = ckpt.read_text().strip()
        step = int(newest.removeprefix("step_"))
        assert line == (
            f"interrupted: newest checkpoint {run_dir / 'checkpoints' / newest} (step {step}); "
            f"continue with: rlkit train {run_dir / 'config.toml'} --resume"
        )
        assert printed_command(line) == command
        assert "changed from the saved run" not in log.read_text()

        # resume with one override: it is named, the rest comes from the saved config
        text = run([*command, "--orchestrator.max_steps=4"], next(logs))
        assert "resume: changed from the saved run: orchestrator.max_steps 3 -> 4" in text
        assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4]

        # a finished run: said so, exit 0, nothing started, nothing appended
        metrics = (run_dir / "metrics.jsonl").read_text()
        logs_before = sorted(p.name for p in (run_dir / "logs").iterdir())
        text = run(command, next(logs))
        assert f"run {run_dir} already finished at step 4" in text
        assert "trainer pid" not in text and "resume: rolled back" not in text
        assert (run_dir / "metrics.jsonl").read_text() == metrics
        assert sorted(p.name for p in (run_dir / "logs").iterdir()) == logs_before
