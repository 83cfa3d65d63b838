"""`rlkit train --inference.weight_transfer=broadcast` to two real vLLM CPU servers: every
version reaches both over the trainer's gloo group (checkpoint steps as files), the canary KL
after each update is as small as after the filesystem updates of the same run, and a server
killed mid-broadcast (the worker extension's exit hook, after one bucket) is named, dropped and
relaunched while the run goes on to its end. And a run's only server, SIGKILLed between updates,
is relaunched and rejoins with the trainer's filesystem copy of the current version, written on
request (no broadcast can come before it serves again: no rollouts, no next batch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.weights import EXIT_MID_UPDATE_ENV
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.train_runs import SHORT, records, run, run_killing_the_server

pytestmark = pytest.mark.slow
STEPS = 5
TIMEOUT_S = 20
CKPT = 4  # step 4 is published as files (a checkpoint step), the others by broadcast


def test_broadcast_to_two_servers_survives_one_killed_mid_update(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={STEPS}",
        f"--ckpt.interval={CKPT}",
        "--inference.num_servers=2",
        "--inference.weight_transfer=broadcast",
        f"--inference.broadcast_timeout_s={TIMEOUT_S}",
        "--inference.broadcast_bucket_mb=1",  # several buckets even for the tiny model
    )
    monkeypatch.setenv(EXIT_MID_UPDATE_ENV, "2:2")  # rank 2 (second server) at version 2
    log = tmp_path / "run.log"
    assert run(cmd, log) == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))

    output = log.read_text()
    assert "is down" in output  # the killed server, named by its URL, dropped
    # its engine's death ends its request at once; the trainer names it within the timeout
    assert records[1]["weight_update_s"] < 2 * TIMEOUT_S + 10
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "broadcast of version 2" in trainer_log and "rank 2 (http://" in trainer_log
    assert records[-1]["inference_servers_dropped"] >= 1

    kls = {r["step"]: r["weights_canary_kl"] for r in records}
    by_files = kls[CKPT]
    by_broadcast = [kl for step, kl in kls.items() if step != CKPT]
    assert all(kl is not None for kl in kls.values()), kls
    assert max(by_broadcast) < max(10 * by_files, 1e-3), kls
    weights = run_dir / "weights"
    assert (weights / "step_000002" / "files" / "STABLE").exists()  # the fallback copy
    assert not list((weights / "step_000003").glob("*.safetensors"))  # broadcast only
    assert list((weights / f"step_{CKPT:06d}").glob("*.safetensors"))


def test_the_only_server_killed_between_updates_rejoins_with_files(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    steps = 5
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={steps}",
        "--ckpt.interval=0",  # no checkpoint step: no version is written as files unasked
        "--inference.weight_transfer=broadcast",
        f"--inference.broadcast_timeout_s={TIMEOUT_S}",
        "--inference.health_interval_s=1",
    )
    log = tmp_path / "run.log"
    code = run_killing_the_server(cmd, log, run_dir, after_step=2)
    assert code == 0, log.read_text()[-3000:]
    recs = records(run_dir)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    output = log.read_text()
    assert "is down" in output and "is back" in output, output[-3000:]
    assert recs[-1]["inference_servers_rejoined"] == 1
    # the version it rejoined at, written on request (or because the kill cut a broadcast)
    copies = sorted((run_dir / "weights").glob("step_*/files/model.safetensors"))
    assert len(copies) == 1, copies
    kls = [r["weights_canary_kl"] for r in recs]  # None: the server died before its canary
    assert all(kl is None or kl < 1e-3 for kl in kls) and kls[-1] is not None, kls
