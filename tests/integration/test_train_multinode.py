"""A 2-"node" trainer on localhost: two `rlkit train --role trainer` launchers (torchrun
--nnodes 2, c10d rendezvous on 127.0.0.1, gloo, one rank each), one inference server and one
orchestrator, all separate processes sharing one run_dir (as on four machines).

One run, three phases:
1. train; once step 1's checkpoint exists, node 1 is killed (SIGKILL: a lost machine). Node 0's
   ranks fail at their next collective, its launcher reports the failure through run_dir and the
   orchestrator stops at once; nothing survives, and the step-1 checkpoint is intact.
2. `--resume` of orchestrator and both nodes (the same server) finishes the run.
3. one trainer process on one node replays the run's batches from the start: its loss on every
   step equals the 2-node run's (resumed from the checkpoint in between).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlkit.ports import free_port
from tests.helpers.roles import (
    alive,
    descendants,
    kill_all,
    start,
    status,
    steps_logged,
    wait_exit,
    wait_healthy,
)
from tests.helpers.roles import train_cmd as roles_train_cmd

STEPS = 3

pytestmark = pytest.mark.slow


def train_cmd(model: Path, run_dir: Path, *extra: str) -> list[str]:
    return roles_train_cmd(
        model,
        run_dir,
        "--ckpt.interval=1",
        "--trainer.weights.keep_last=3",
        # a lost peer that gloo does not notice at once is noticed within this; 60 s was too
        # short for a live peer's export on a loaded machine (a publish barrier timed out)
        "--trainer.collective_timeout_s=150",
        "--orchestrator.eval.at_end=false",
        *extra,
    )


def node_cmd(model: Path, run_dir: Path, node: int, endpoint: str, *extra: str) -> list[str]:
    return train_cmd(
        model,
        run_dir,
        "--role",
        "trainer",
        "--trainer.nnodes=2",
        f"--trainer.node_rank={node}",
        f"--trainer.rdzv_endpoint={endpoint}",
        *extra,
    )


def trainer_records(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "trainer_metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if r}


def latest_checkpoint(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    return int(pointer.read_text().strip().removeprefix("step_")) if pointer.exists() else 0


def test_two_trainer_nodes_kill_resume_and_match_one_node(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []

    def launch(name: str, cmd: list[str]) -> subprocess.Popen:
        logs.append(tmp_path / f"{name}.log")
        proc = start(cmd, logs[-1])
        procs.append(proc)
        return proc

    def orchestrator(*extra: str) -> subprocess.Popen:
        cmd = train_cmd(
            tiny_model_dir, run_dir, "--role", "orchestrator", f'--inference.urls=["{url}"]', *extra
        )
        return launch(f"orchestrator{len(procs)}", cmd)

    try:
        inference = launch(
            "inference",
            train_cmd(
                tiny_model_dir, run_dir, "--role", "inference", f"--inference.base_port={port}"
            ),
        )
        # phase 1: two trainer nodes; node 1 dies after step 1's checkpoint
        endpoint = f"127.0.0.1:{free_port()}"
        nodes = [
            launch(f"node{n}", node_cmd(tiny_model_dir, run_dir, n, endpoint)) for n in (1, 0)
        ][::-1]
        wait_healthy(url, inference, seen, timeout=300)
        orch = orchestrator()
        deadline = time.monotonic() + 400
        while latest_checkpoint(run_dir) < 1:
            for p in (orch, *nodes):
                seen |= descendants(p.pid)
                assert p.poll() is None, f"exited early: {p.args}\n{logs[procs.index(p)]}"
            assert time.monotonic() < deadline, "no checkpoint of step 1"
            time.sleep(0.2)
        node1_tree = descendants(nodes[1].pid) | {nodes[1].pid}
        assert len(node1_tree) >= 3, "node 1 runs no torchrun agent and rank"
        nodes[1].send_signal(signal.SIGKILL)  # the machine is gone, its launcher says nothing
        wait_exit([orch, nodes[0]], seen, 300, logs)
        assert nodes[0].returncode != 0 and orch.returncode != 0
        orch_log = logs[procs.index(orch)].read_text()
        assert "error: trainer node 0 exited with code" in orch_log, orch_log[-3000:]
        assert "Traceback" not in orch_log  # a one-line error, exit code 1
        assert orch.returncode == 1
        time.sleep(1)
        serving = descendants(inference.pid) | {inference.pid}
        survivors = [pid for pid in (seen | node1_tree) - serving if alive(pid)]
        assert not survivors, "trainer or orchestrator processes survived"
        stopped_at = latest_checkpoint(run_dir)
        assert stopped_at >= 1 and (run_dir / "checkpoints" / f"step_{stopped_at:06d}").is_dir()
        assert stopped_at < STEPS

        # phase 2: resume both nodes and the orchestrator against the same server
        orch = orchestrator("--resume")
        stale = run_dir / "batches" / f"step_{stopped_at + 1:06d}.pt"
        while stale.exists() and orch.poll() is None:  # rolled back before trainers look
            time.sleep(0.05)
        nodes = [
            launch(f"resumed{n}", node_cmd(tiny_model_dir, run_dir, n, endpoint, "--resume"))
            for n in (1, 0)
        ][::-1]
        wait_exit([orch, *nodes], seen, 400, logs)
        for proc in (orch, *nodes):
            assert proc.returncode == 0, logs[procs.index(proc)].read_text()[-3000:]
        assert steps_logged(run_dir) == list(range(1, STEPS + 1))
        assert status(url, run_dir / "token")["policy_version"] == STEPS
        assert (run_dir / "logs" / "trainer-node0.log").exists()
        assert (run_dir / "logs" / "trainer-node1.log").exists()
        inference.send_signal(signal.SIGTERM)
        inference.wait(timeout=60)

        # phase 3: one node, one process, the same batches from the start
        replay = tmp_path / "replay"
        shutil.copytree(run_dir / "batches", replay / "batches")
        one = launch("replay", train_cmd(tiny_model_dir, replay, "--role", "trainer"))
        wait_exit([one], seen, 300, logs)
        assert one.returncode == 0, logs[-1].read_text()[-3000:]
    finally:
        kill_all(procs, seen)
    two_nodes, one_node = trainer_records(run_dir), trainer_records(replay)
    assert sorted(two_nodes) == sorted(one_node) == list(range(1, STEPS + 1))
    for step, one in one_node.items():
        two = two_nodes[step]
        assert two["num_tokens"] == one["num_tokens"], step
        # the loss is a near-cancelling sum (advantages have mean 0): an absolute tolerance
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6), step
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4), step
