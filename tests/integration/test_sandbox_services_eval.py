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
from tests.helpers.sandbox_service import sandbox_service, shm_left

pytestmark = [pytest.mark.system, pytest.mark.slow]
PROBLEMS = [json.loads(line) for line in OFFLINE.read_text().splitlines()]


def slow_reference(body: dict[str, Any]) -> str:
    """Each problem's reference solution, a little later (so the eval outlasts the kill)."""
    time.sleep(0.1)
    question = next(m["content"] for m in body["messages"] if m["role"] == "user")
    problem = next(p for p in PROBLEMS if question.startswith(p["question"]))
    return f"```python\n{problem['reference']}```"


def _mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


def _fds(service) -> int:
    return len(os.listdir(f"/proc/{service.proc.pid}/fd"))


def test_an_eval_survives_one_of_two_services_killed(tmp_path: Path) -> None:
    shm_before, mounts_before = set(os.listdir("/dev/shm")), _mounts()
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
        fds_before = _fds(second)
        eval_run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        killed = threading.Event()
        under_first: list[int] = []  # the killed service's sandboxes and fork servers

        def kill_first_once_busy() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and eval_run.poll() is None:
                if first.metrics()["runs"] >= 3:
                    under_first.extend(first.descendants())
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
        # the surviving service holds no more descriptors than before the eval (its sandboxes'
        # pipes and sockets, the dead service's connections): back within a refill's few
        deadline = time.monotonic() + 10
        while _fds(second) > fds_before + 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _fds(second) <= fds_before + 4, (fds_before, _fds(second))
    for svc in (first, second):
        assert not svc.descendants()
    deadline = time.monotonic() + 10  # SIGKILLed trees take a moment to be torn down
    while [p for p in under_first if Path(f"/proc/{p}").exists()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert under_first and not [p for p in under_first if Path(f"/proc/{p}").exists()]
    assert not shm_left(shm_before)
    assert _mounts() == mounts_before  # the sandboxes' mounts lived in their own namespaces
