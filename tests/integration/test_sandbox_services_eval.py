"""`rlkit eval code` on two sandbox services, one SIGKILLed mid-eval (issue 64): every rollout
is finished (its programs moved to the other service) or errored with the reason, none lost or
hung, and no sandbox process or /dev/shm file is left on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from code_env.dataset import OFFLINE

from rlkit.eval import load_run
from tests.helpers.cli import only_run_dir
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.sandbox_service import sandbox_service

pytestmark = [pytest.mark.system, pytest.mark.slow]
PROBLEMS = [json.loads(line) for line in OFFLINE.read_text().splitlines()]


def slow_reference(body: dict[str, Any]) -> str:
    """Each problem's reference solution, a little later (so the eval outlasts the kill)."""
    time.sleep(0.1)
    question = next(m["content"] for m in body["messages"] if m["role"] == "user")
    problem = next(p for p in PROBLEMS if question.startswith(p["question"]))
    return f"```python\n{problem['reference']}```"


def test_an_eval_survives_one_of_two_services_killed(tmp_path: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    args = ["--pool-size", "2", "--concurrency", "2"]
    with (
        sandbox_service(tmp_path, *args) as first,
        sandbox_service(tmp_path, *args) as second,
        FakeOpenAIServer(responder=slow_reference) as model,
    ):
        env = {
            **os.environ,
            "RLKIT_SANDBOX_URL": f"{first.url},{second.url}",
            "RLKIT_SANDBOX_TOKEN_FILE": str(first.token_file),
        }
        command = [sys.executable, "-m", "rlkit_cli.main", "eval", "code", "-m", "fake-model"]
        command += ["-b", model.url, "-n", str(len(PROBLEMS)), "-r", "3"]
        command += ["-o", str(tmp_path / "out")]
        eval_run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        killed = threading.Event()

        def kill_first_once_busy() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and eval_run.poll() is None:
                if first.metrics()["runs"] >= 3:
                    first.proc.kill()
                    killed.set()
                    return
                time.sleep(0.05)

        killer = threading.Thread(target=kill_first_once_busy)
        killer.start()
        output, _ = eval_run.communicate(timeout=300)
        killer.join()
        assert killed.is_set(), "the eval ended before the service was killed"
        assert eval_run.returncode in (0, 1), output
        run = load_run(only_run_dir(tmp_path / "out"))
        assert len(run.results) == 3 * len(PROBLEMS)  # none lost
        for result in run.results:
            rollout = result.rollout
            assert rollout.error is None or "sandbox" in rollout.error, rollout.error
        finished = [r for r in run.results if r.rollout.error is None]
        assert all(r.rollout.reward == 1.0 for r in finished)
        assert len(finished) >= len(run.results) - 2  # programs moved: at most the in-flight
        assert second.metrics()["runs"] > 0
    for svc in (first, second):
        assert not svc.descendants()
    assert set(os.listdir("/dev/shm")) <= shm_before
