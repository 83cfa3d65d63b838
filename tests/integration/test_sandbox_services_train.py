"""`rlkit train` with one sandbox service per node (issue 64): `[sandbox] serve` starts the
orchestrating process's own and `--role sandbox` another node's (here: another process on this
host, the run's token), the rollouts' programs go to both (`sandbox.service_urls`), and the other
one is SIGKILLed during a training step. Every rollout is finished (its programs moved to the
run's own service) or recorded as errored with the reason, none lost or hung, the run trains
every step, and no sandbox process, mount, descriptor or /dev/shm file is left on the host."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from rlkit.ports import free_port
from rlkit.protocol.credentials import read_token
from rlkit.runs.rollout_errors import ERRORS_FILE
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.sandbox_service import pids_with, shm_left
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import SHORT, records, run, start

pytestmark = [pytest.mark.system, pytest.mark.slow]
STEPS = 3


def _tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


def test_rlkit_train_survives_a_sandbox_node_killed_mid_step(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir, log, node_log = tmp_path / "run", tmp_path / "run.log", tmp_path / "node.log"
    shm_before, mounts_before = set(os.listdir("/dev/shm")), _mounts()
    fds_before = len(os.listdir("/proc/self/fd"))
    port = free_port()
    node_url = f"http://127.0.0.1:{port}"
    serve = [
        "--env.0.id=sandboxed-reverse",
        "--env.0.args={n = 20}",
        "--sandbox.serve=true",
        '--sandbox.serve_args=["--concurrency", "2", "--pool-size", "2"]',
    ]
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        node_cmd = tiny_train_cmd(tiny_model_dir, run_dir, *urls, *serve)
        node = start([*node_cmd, "--role", "sandbox", f"--sandbox.serve_port={port}"], node_log)
        try:
            deadline = time.monotonic() + 120
            while True:  # the other node's service is up before the run starts
                assert node.poll() is None, node_log.read_text()[-3000:]
                assert time.monotonic() < deadline, node_log.read_text()[-3000:]
                try:
                    if httpx.get(f"{node_url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            key = f"sandbox-{socket.gethostname()}-{port}"
            service_pid = json.loads((run_dir / "pids.json").read_text())[key][0]
            headers = {"Authorization": f"Bearer {read_token(run_dir / 'sandbox.token')}"}
            seen: dict[str, list[int]] = {}

            def kill_the_node_mid_step() -> None:
                """Once both services ran programs of the run, SIGKILL the other node's."""
                deadline = time.monotonic() + 400
                while time.monotonic() < deadline:
                    try:
                        ran = httpx.get(f"{node_url}/metrics", headers=headers, timeout=5)
                        if ran.json()["runs"] >= 4:
                            own = json.loads((run_dir / "pids.json").read_text())["sandbox"][0]
                            seen["own"] = _tree(own)
                            seen["killed"] = _tree(service_pid)
                            os.kill(service_pid, 9)
                            return
                    except (httpx.HTTPError, KeyError, OSError, ValueError):
                        pass
                    time.sleep(0.05)

            killer = threading.Thread(target=kill_the_node_mid_step)
            killer.start()
            steps = f"--orchestrator.max_steps={STEPS}"
            cmd = tiny_train_cmd(
                tiny_model_dir,
                run_dir,
                *SHORT,
                steps,
                *urls,
                *serve,
                f'--sandbox.service_urls=["{node_url}"]',
            )
            code = run(cmd, log, timeout=600)
            killer.join()
            node.wait(timeout=30)  # its service gone, the sandbox node's role ends
        finally:
            if node.poll() is None:
                node.kill()
                node.wait()
    text = " ".join(log.read_text().split())  # rich wraps long lines
    assert code == 0, text[-3000:]
    assert seen, "the run ended before the other node's service was killed"
    assert node.returncode != 0 and "sandbox service exited" in node_log.read_text()
    assert "sandbox services of the run: http://127.0.0.1:" in text and node_url in text
    steps_done = records(run_dir)
    assert [r["step"] for r in steps_done][-1] == STEPS  # every step trained: nothing hung
    errored = sum(r["rollouts_errored"] for r in steps_done)
    errors_path = run_dir / ERRORS_FILE
    lines = errors_path.read_text().splitlines() if errors_path.exists() else []
    errors = [json.loads(line) for line in lines]
    assert len([e for e in errors if e["phase"] == "train"]) == errored  # none unrecorded
    for error in errors:  # a program on the dead service: errored with the reason
        assert "sandbox" in (error["error"] or ""), error
    assert errored <= 4  # the programs in flight there at most: the others moved
    summary = re.search(r"sandbox service: (\d+) programs, .*?(\d+) sandbox errors", text)
    assert summary is not None and int(summary[1]) > 0 and int(summary[2]) == 0, text[-3000:]
    # nothing left on the host: processes of either service, their mounts, /dev/shm files,
    # descriptors
    deadline = time.monotonic() + 15
    while _alive(seen["own"] + seen["killed"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(seen["own"] + seen["killed"])
    assert not pids_with(str(run_dir))
    assert not shm_left(shm_before)
    assert _mounts() == mounts_before
    assert len(os.listdir("/proc/self/fd")) <= fds_before


def test_a_sigkilled_rlkit_train_takes_its_sandbox_service_along(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL of `rlkit train` mid-step: its sandbox service (a parent-death signal) and every
    sandbox under it go too; no process, mount or /dev/shm file of the run is left."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    shm_before, mounts_before = set(os.listdir("/dev/shm")), _mounts()
    seen: set[int] = set()
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            "--orchestrator.max_steps=50",  # killed long before
            *urls,
            "--env.0.id=sandboxed-reverse",
            "--env.0.args={n = 20}",
            "--sandbox.serve=true",
            '--sandbox.serve_args=["--concurrency", "2", "--pool-size", "2"]',
        )
        train = start(cmd, log)
        try:
            deadline = time.monotonic() + 300
            while True:  # programs of the run flowing through its service: mid-step
                assert train.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    pid = json.loads((run_dir / "pids.json").read_text())["sandbox"][0]
                    token = read_token(run_dir / "sandbox.token")
                    url = re.search(r"sandbox service at (http://\S+)", log.read_text())
                    metrics = httpx.get(
                        f"{url[1]}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=5
                    ).json()
                    if metrics["runs"] >= 2:
                        break
                except Exception:  # not up yet: no pids, token, URL or answer
                    pass
                time.sleep(0.1)
            seen |= set(_tree(train.pid))
            assert pid in seen and len(_tree(pid)) > 1  # the service and its sandboxes
            os.kill(train.pid, 9)
            train.wait()
            deadline = time.monotonic() + 20
            while _alive(sorted(seen)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _alive(sorted(seen)), [
                Path(f"/proc/{p}/cmdline").read_bytes() for p in _alive(sorted(seen))
            ]
        finally:
            for pid in _alive(sorted(seen)):
                os.kill(pid, 9)
    assert not pids_with(str(run_dir))
    assert not shm_left(shm_before)
    assert _mounts() == mounts_before
