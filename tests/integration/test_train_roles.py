"""`rlkit train` roles on one machine: inference, trainer and orchestrator as three processes
sharing one run_dir (as on three machines), and role `all` with two inference servers.

A fresh tiny model (no SFT: the reward is irrelevant here, so zero-advantage groups are kept)
runs 3 short C3PO++ steps. Checked: the step records, the policy version on the separately run
server (weights published by the trainer and loaded by the orchestrator), that both servers of a
pool get generation requests and every step's weight update, and that no child survives.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rlkit.ports import free_port
from rlkit.protocol.credentials import write_token_file
from tests.helpers.roles import (
    STEPS,
    alive,
    descendants,
    kill_all,
    start,
    status,
    steps_logged,
    train_cmd,
    wait_exit,
    wait_healthy,
)

pytestmark = pytest.mark.slow


def access_count(log: Path, path: str) -> int:
    """Successful (200) POSTs to `path` in a vLLM server's access log."""
    pattern = rf'"POST {re.escape(path)} HTTP/[0-9.]+" 200'
    return len(re.findall(pattern, log.read_text(errors="ignore")))


def generation_count(log: Path) -> int:
    """Generation requests a server answered: token-in turns use the completions API, message
    turns the chat API."""
    return sum(access_count(log, f"/v1/{api}") for api in ("completions", "chat/completions"))


def steps_alone(run_dir: Path) -> int:
    """Steps logged while only one of two servers was healthy."""
    return sum(r["inference_servers_healthy"] == 1 for r in records(run_dir))


def two_free_ports() -> int:
    """A free port whose successor is free too (num_servers=2 uses base_port and base_port+1)."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def test_roles_as_separate_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = {name: tmp_path / f"{name}.log" for name in ("inference", "trainer", "orchestrator")}
    seen: set[int] = set()
    procs: list[subprocess.Popen] = []
    try:
        inference = start(
            train_cmd(
                tiny_model_dir, run_dir, "--role", "inference", f"--inference.base_port={port}"
            ),
            logs["inference"],
        )
        procs.append(inference)
        trainer = start(train_cmd(tiny_model_dir, run_dir, "--role", "trainer"), logs["trainer"])
        procs.append(trainer)
        wait_healthy(url, inference, seen, timeout=300)
        orchestrator = start(
            train_cmd(
                tiny_model_dir,
                run_dir,
                "--role",
                "orchestrator",
                f'--inference.urls=["{url}"]',
                "--orchestrator.eval.at_end=false",
            ),
            logs["orchestrator"],
        )
        procs.append(orchestrator)
        wait_exit([orchestrator, trainer], seen, 400, list(logs.values()))
        assert orchestrator.returncode == 0, logs["orchestrator"].read_text()[-3000:]
        assert trainer.returncode == 0, logs["trainer"].read_text()[-3000:]
        assert steps_logged(run_dir) == list(range(1, STEPS + 1))
        for step in range(1, STEPS + 1):
            assert (run_dir / "weights" / f"step_{step:06d}" / "STABLE").exists()
        assert (
            status(url, run_dir / "token")["policy_version"] == STEPS
        )  # the server serves the last weights
        server_log = run_dir / "logs" / "inference-0.log"
        assert generation_count(server_log) > 0
        # each step's weights were loaded on this server (the servers stop with the run, so the
        # access log, not a live /rlkit/status, is the record)
        assert access_count(server_log, "/rlkit/update_weights") == STEPS

        seen |= descendants(inference.pid)
        assert seen, "the inference role started no server"
        inference.send_signal(signal.SIGTERM)  # as a process manager stops it
        inference.wait(timeout=60)
        time.sleep(1)
        assert not [pid for pid in seen if alive(pid)], "children survived their role"
    finally:
        kill_all(procs, seen)


def test_two_servers_round_robin(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    port = two_free_ports()

    log = tmp_path / "train.log"
    seen: set[int] = set()
    proc = start(
        train_cmd(
            tiny_model_dir,
            run_dir,
            "--inference.num_servers=2",
            f"--inference.base_port={port}",
        ),
        log,
    )
    try:
        wait_exit([proc], seen, 500, [log])
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        kill_all([proc], seen)
    assert steps_logged(run_dir) == list(range(1, STEPS + 1))
    for i in range(2):
        server_log = run_dir / "logs" / f"inference-{i}.log"
        requests = generation_count(server_log)
        assert requests >= 8, f"server {i} got {requests} requests, not even one group"
        # each step's weights were loaded on this server (the servers stop with the run, so the
        # access log, not a live /rlkit/status, is the record)
        assert access_count(server_log, "/rlkit/update_weights") == STEPS
    pids = json.loads((run_dir / "pids.json").read_text())
    assert len(pids["inference"]) == 2
    time.sleep(1)
    assert seen >= set(pids["inference"]) | set(pids["trainer"])
    assert not [pid for pid in seen if alive(pid)], "children survived the run"


def role_group(run_dir: Path) -> list[int]:
    """Pids of the inference servers an inference role launched (from its pids.json)."""
    return json.loads((run_dir / "pids.json").read_text())["inference"]


def signal_tree(root: int, sig: signal.Signals) -> None:
    """Send `sig` to `root` and every process below it (our own processes only)."""
    for pid in [root, *descendants(root)]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_for(predicate, what: str, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for p in procs:
            assert p.poll() is None, f"{p.args[3:5]} exited with {p.returncode} waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.5)


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_killed_inference_server_is_dropped_and_rejoins(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two inference roles (two machines), one killed mid-run: no batch is lost, the run goes on
    with one server, and the server started again rejoins (brought to the current weights).

    The trainer is held (SIGSTOP) while the killed server restarts, so that the run is still
    going when it is back; its engine start takes longer than a few tiny steps."""
    steps = 12  # room after the rejoin: C3PO++ generates a step ahead while the trainer is held
    run_dir = tmp_path / "run"
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b", "b2", "trainer", "orch")}
    token = tmp_path / "token"  # one credential for the run's roles on their "machines"
    write_token_file(token)
    shared = [f"--inference.token_file={token}", f'--inference.weights_roots=["{run_dir}"]']
    seen: set[int] = set()
    procs: list[subprocess.Popen] = []

    def inference(name: str, port: int) -> subprocess.Popen:
        cmd = train_cmd(tiny_model_dir, tmp_path / f"inf_{name}", "--role", "inference", *shared)
        proc = start([*cmd, f"--inference.base_port={port}"], logs[name])
        procs.append(proc)
        return proc

    try:
        inference("a", ports[0])
        server_b = inference("b", ports[1])
        trainer = start(
            train_cmd(
                tiny_model_dir,
                run_dir,
                "--role",
                "trainer",
                f"--orchestrator.max_steps={steps}",
                *shared,
            ),
            logs["trainer"],
        )
        procs.append(trainer)
        for url, proc in zip(urls, procs[:2], strict=True):
            wait_healthy(url, proc, seen, timeout=300)
        orchestrator = start(
            train_cmd(
                tiny_model_dir,
                run_dir,
                "--role",
                "orchestrator",
                f"--orchestrator.max_steps={steps}",
                f"--inference.urls={json.dumps(urls)}",
                "--inference.health_interval_s=1",
                *shared,
                "--orchestrator.eval.at_end=false",
            ),
            logs["orch"],
        )
        procs.append(orchestrator)
        running = [orchestrator, trainer]
        wait_for(lambda: len(records(run_dir)) >= 2, "step 2", 300, running)
        seen |= descendants(server_b.pid)
        signal_tree(server_b.pid, signal.SIGKILL)  # the machine of server b goes away
        server_b.wait(timeout=30)
        down = f"inference server {urls[1]} is down"
        wait_for(lambda: down in logs["orch"].read_text(), "server b dropped", 120, running)
        # a step logged after the drop (the steps just after the kill may have been generated
        # before it: C3PO++ runs ahead)
        wait_for(lambda: steps_alone(run_dir) > 0, "a step on server a alone", 300, running)
        signal_tree(trainer.pid, signal.SIGSTOP)  # hold the run while b restarts
        try:
            inference("b2", ports[1])
            wait_healthy(urls[1], procs[-1], seen, timeout=300)
            rejoined = f"inference server {urls[1]} is back"
            wait_for(lambda: rejoined in logs["orch"].read_text(), "rejoin", 120, [orchestrator])
        finally:
            signal_tree(trainer.pid, signal.SIGCONT)
        wait_exit([orchestrator, trainer], seen, 400, list(logs.values()))
        assert orchestrator.returncode == 0, logs["orch"].read_text()[-3000:]
        assert trainer.returncode == 0, logs["trainer"].read_text()[-3000:]

        recs = records(run_dir)
        assert [r["step"] for r in recs] == list(range(1, steps + 1))  # no batch lost
        assert all(r["rollouts_errored"] == 0 for r in recs), "a generation failure was trained"
        assert steps_alone(run_dir) > 0
        assert recs[-1]["inference_servers_healthy"] == 2
        assert recs[-1]["inference_servers_dropped"] == 1
        assert recs[-1]["inference_servers_rejoined"] == 1
        # the restarted server was brought to the current weights and then served the run
        assert status(urls[1], token)["policy_version"] == steps
        b2_log = tmp_path / "inf_b2" / "logs" / "inference-0.log"
        orch_text = logs["orch"].read_text()
        assert generation_count(b2_log) > 0  # back in the round robin
        back_at = int(re.search(rf"{rejoined} \(policy version (\d+)\)", orch_text).group(1))
        updates = access_count(b2_log, "/rlkit/update_weights")
        assert updates >= steps - back_at  # every step after the rejoin (plus the rejoin)
    finally:
        kill_all(procs, seen)
