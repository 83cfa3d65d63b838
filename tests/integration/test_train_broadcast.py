"""`rlkit train --inference.weight_transfer=broadcast` to two real vLLM CPU servers: every
version reaches both over the trainer's gloo group (checkpoint steps as files), the canary KL
after each update is as small as after the filesystem updates of the same run, and a server
killed mid-broadcast (the worker extension's exit hook, after one bucket) is named and
relaunched while the run goes on to its end: dropped until it rejoins, or, when it is back
within the broadcast's timeout, given the trainer's filesystem copy in the same update. And a
run's only server, SIGKILLed between updates, is relaunched and rejoins with the trainer's
filesystem copy of the current version, written on request (no broadcast can come before it
serves again: no rollouts, no next batch). Meanwhile another local process, without the run's
token, plants forged handshake messages for every later version on the trainer's store (it
has no authentication); they change nothing."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from rlkit.protocol import handoff
from rlkit.protocol.credentials import new_token, rendezvous_secret
from rlkit.protocol.weights import PublishedVersion
from rlkit.weights.broadcast import (
    BroadcastDelivery,
    Channel,
    Closed,
    Done,
    FilesReady,
    GroupInfo,
    Joined,
    Peers,
    Rejoin,
    Verdict,
)
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.train_runs import SHORT, records, run, run_killing_the_server

pytestmark = pytest.mark.slow
STEPS = 5
TIMEOUT_S = 20
CKPT = 4  # step 4 is published as files (a checkpoint step), the others by broadcast


def test_broadcast_to_two_servers_survives_one_killed_mid_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={STEPS}",
        f"--ckpt.interval={CKPT}",
        "--inference.num_servers=2",
        # a broadcast whose rank 2 (second server) exits mid-update at version 2
        "--inference.weight_transfer=faulty_transports:BroadcastKilledMidUpdate",
        f"--inference.transfer_params.timeout_s={TIMEOUT_S}",
        "--inference.transfer_params.bucket_mb=1",  # several buckets even for the tiny model
    )
    log = tmp_path / "run.log"
    assert run(cmd, log) == 0, log.read_text()[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))

    output = log.read_text()
    assert "relaunching" in output  # the killed server's process exits and is started again
    # its engine's death ends its request at once; the trainer names it within the timeout
    assert records[1]["weight_update_s"] < 2 * TIMEOUT_S + 10
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "broadcast of version 2" in trainer_log and "rank 2 (http://" in trainer_log
    if "is down" in output:  # named by its URL and dropped, until it rejoins
        assert records[-1]["inference_servers_dropped"] >= 1
    else:  # relaunched within the broadcast's timeout: it loaded the filesystem copy at once
        assert records[-1]["inference_servers_dropped"] == 0
        assert records[1]["weight_update_s"] >= TIMEOUT_S

    kls = {r["step"]: r["weights_canary_kl"] for r in records}
    by_files = kls[CKPT]
    by_broadcast = [kl for step, kl in kls.items() if step != CKPT]
    assert all(kl is not None for kl in kls.values()), kls
    assert max(by_broadcast) < max(10 * by_files, 1e-3), kls
    weights = run_dir / "weights"
    assert (weights / "step_000002" / "files" / "STABLE").exists()  # the fallback copy
    assert not list((weights / "step_000003").glob("*.safetensors"))  # broadcast only
    assert list((weights / f"step_{CKPT:06d}").glob("*.safetensors"))


FORGED_PATH = "/attacker/weights"


def plant_forgeries(run_dir: Path, versions: range, planted: list[int]) -> None:
    """Another local process: it finds the trainer's store in the first broadcast record and
    sets every handshake message of `versions` on it, signed with a secret of its own. Accepted,
    they would make the trainer write files (`Rejoin`), the servers load `FORGED_PATH`, or the
    trainer wait for a peer that never joins."""
    record = run_dir / "weights" / "step_000001"
    deadline = time.monotonic() + 600
    while not handoff.is_published(record):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    published = PublishedVersion.read(record)
    assert published is not None and published.transport == "broadcast"
    host, port = BroadcastDelivery.of(published).address
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
    secret = rendezvous_secret(new_token())  # not the run's
    for version in versions:
        forged = Channel(store, version, secret)
        for message in (
            Peers(labels=["attacker"]),
            GroupInfo(id=666, size=2),
            Verdict(files_needed=True),
            Rejoin(),
            FilesReady(path=FORGED_PATH),
            Closed(),
        ):
            forged.put(message)
        for worker in (1, 2):
            forged.put(Joined(held=666), worker)
            forged.put(Done(), worker)
        planted.append(version)


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
        f"--inference.transfer_params.timeout_s={TIMEOUT_S}",
        "--inference.health_interval_s=1",
    )
    log = tmp_path / "run.log"
    planted: list[int] = []
    attacker = threading.Thread(
        target=plant_forgeries, args=(run_dir, range(2, steps + 1), planted), daemon=True
    )
    attacker.start()
    code = run_killing_the_server(cmd, log, run_dir, after_step=2)
    attacker.join(timeout=10)
    assert code == 0, log.read_text()[-3000:]
    assert planted == list(range(2, steps + 1))  # in place before most versions were sent
    assert FORGED_PATH not in log.read_text() + (run_dir / "logs" / "inference-0.log").read_text()
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
