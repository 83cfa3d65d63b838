"""`rlkit train --inference.weight_transfer=ipc` against the real vLLM CPU server: every version
reaches the server through the trainer's shared buffer (checkpoint steps as files), the canary
KL after each ipc update is as small as after the filesystem update of the same run, nothing is
left in /dev/shm; and a server whose worker is killed mid-update (the test hook: after it mapped
the buffer) is relaunched and catches up from the buffer the trainer still holds, while the run
goes on to its end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlkit.protocol.weights import PublishedVersion
from rlkit.weights import EXIT_MID_UPDATE_ENV
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.train_runs import SHORT, records, run

pytestmark = pytest.mark.slow
STEPS = 5
CKPT = 4  # step 4 is published as files (a checkpoint step), the others through the buffer


def rlkit_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "rlkit" in n or n.startswith("torch_")}


def test_ipc_updates_match_the_filesystem_ones_and_leave_nothing_behind(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    before = rlkit_shm()
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={STEPS}",
        f"--ckpt.interval={CKPT}",
        "--inference.weight_transfer=ipc",
    )
    log = tmp_path / "run.log"
    assert run(cmd, log) == 0, log.read_text()[-3000:]
    steps = records(run_dir)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    kls = {r["step"]: r["weights_canary_kl"] for r in steps}
    assert all(kl is not None for kl in kls.values()), kls
    by_ipc = [kl for step, kl in kls.items() if step != CKPT]
    assert max(by_ipc) < max(10 * kls[CKPT], 1e-3), kls
    weights = run_dir / "weights"
    shared = PublishedVersion.read(weights / "step_000005")
    assert shared is not None and shared.transport == "ipc"
    assert not list((weights / "step_000005").glob("*.safetensors"))  # nothing written
    assert PublishedVersion.read(weights / f"step_{CKPT:06d}").transport == "filesystem"
    assert all(r["weight_update_bytes"] == shared.nbytes for r in steps)
    assert rlkit_shm() == before


def test_a_worker_killed_mid_update_catches_up_from_the_buffer(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        "--orchestrator.max_steps=4",
        "--ckpt.interval=0",
        "--inference.weight_transfer=ipc",
        "--inference.health_interval_s=1",
    )
    # the only server's worker, at version 2, once: its relaunch loads version 2 from the buffer
    monkeypatch.setenv(EXIT_MID_UPDATE_ENV, f"0:2:{tmp_path / 'killed-once'}")
    log = tmp_path / "run.log"
    assert run(cmd, log) == 0, log.read_text()[-3000:]
    steps = records(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    output = log.read_text()
    assert "is down" in output and "is back (policy version 2)" in output, output[-3000:]
    assert steps[-1]["inference_servers_rejoined"] >= 1
    assert (tmp_path / "killed-once").exists()
    assert all(r["weights_canary_kl"] < 1e-2 for r in steps[2:]), steps
