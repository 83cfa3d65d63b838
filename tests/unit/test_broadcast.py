"""The broadcast transport (rlkit.weights.broadcast) between a sender and two receiver
processes on gloo: bounded buckets, identical tensors, a named error within the timeout when
either side dies mid-way, and the trainer's filesystem copy of its last update for a server that
restarts before the next one (the `Broadcast` transport's trainer side)."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlkit.protocol import handoff
from rlkit.protocol.weights import PublishedVersion, iter_safetensors, mismatches
from rlkit.weights import Reception, TransportSettings, broadcast
from rlkit.weights.broadcast import (
    FILES_DIR,
    Broadcast,
    BroadcastDelivery,
    BroadcastError,
    BroadcastParams,
    Sender,
    announce_peers,
    finish_update,
    receive,
    request_files,
)
from tests.helpers.broadcast_trainer import (
    STALLED,
    broadcast_record,
    sender_stalled_after_first_bucket,
    sender_trickling,
)

KEY = bytes(range(32))  # the key of the tensor tags (a run derives it from its token)

TIMEOUT_S = 5.0
BUCKET = 4096


def model_tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(40, 16, generator=g).bfloat16()),
        ("layer.0.weight", torch.randn(16, 16, generator=g)),
        ("layer.0.bias", torch.randn(16, generator=g).half()),
        ("big.weight", torch.randn(64, 32, generator=g)),  # 8 KiB: a bucket of its own
        ("count", torch.tensor([1, 2, 3], dtype=torch.int64)),
    ]


def receiver(record: PublishedVersion, rank: int, die_after: int | None, out: mp.Queue, go) -> None:
    out.put("ready")  # spawned and imported: the timeouts below are the transport's own
    go.wait()
    got, sizes = [], []
    try:
        for b, bucket in enumerate(receive(record, Reception(rank=rank))):
            sizes.append(sum(t.numel() * t.element_size() for _, t in bucket))
            got += [(n, t.clone()) for n, t in bucket]
            if die_after is not None and b + 1 == die_after:
                os._exit(1)  # killed mid-way
        with io.BytesIO() as saved:  # plain bytes: a queued tensor dies with its process
            torch.save(got, saved)
            out.put((rank, "ok", saved.getvalue(), sizes))
    except BroadcastError as exc:
        out.put((rank, "error", str(exc), None))


def start_receivers(
    record: PublishedVersion, die_after: dict[int, int], go=None, ranks: tuple[int, ...] = (1, 2)
) -> tuple[list, mp.Queue]:
    """Receiver processes (by default two: ranks 1, 2), started once `go` is set (by default:
    now)."""
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), go or ctx.Event()
    procs = [
        ctx.Process(target=receiver, args=(record, rank, die_after.get(rank), out, go))
        for rank in ranks
    ]
    for p in procs:
        p.start()
    assert [out.get(timeout=60) for _ in procs] == ["ready"] * len(procs)
    go.set()
    return procs, out


def test_buckets_are_bounded_and_a_big_tensor_goes_alone() -> None:
    tensors = model_tensors()
    buckets = broadcast.plan_buckets(tensors, BUCKET)
    assert buckets == [(0, 3), (3, 4), (4, 5)]
    delivery = BroadcastDelivery(
        address=("127.0.0.1", 1), backend="gloo", timeout_s=TIMEOUT_S, buckets=buckets
    )
    table = PublishedVersion.build(7, Broadcast.name, tensors, KEY).tensors
    assert [delivery.bucket_size(table, b) <= BUCKET for b in buckets] == [True, False, True]


def test_two_receivers_get_identical_tensors() -> None:
    tensors = model_tensors()
    sender = Sender("127.0.0.1", TIMEOUT_S)
    record = broadcast_record(sender, 7, tensors, BUCKET)
    procs, out = start_receivers(record, {})
    announce_peers(record, ["server-a worker 0", "server-b worker 0"])
    assert sender.send(record, tensors) == ["server-a worker 0", "server-b worker 0"]
    for _ in procs:
        rank, status, got, sizes = out.get(timeout=60)
        assert status == "ok", got
        got = torch.load(io.BytesIO(got))
        assert [n for n, _ in got] == [n for n, _ in tensors]
        for (_, want), (_, have) in zip(tensors, got, strict=True):
            assert have.dtype == want.dtype and torch.equal(have, want)
        assert len(sizes) == 3 and max(sizes[0], sizes[2]) <= BUCKET
    for p in procs:
        p.join(30)


@pytest.mark.slow  # waits out the sender's timeout, 5-8 s
def test_a_receiver_killed_mid_way_is_named_by_the_sender() -> None:
    tensors = model_tensors()
    sender = Sender("127.0.0.1", TIMEOUT_S)
    record = broadcast_record(sender, 3, tensors, BUCKET)
    procs, out = start_receivers(record, {2: 1})
    announce_peers(record, ["server-a worker 0", "server-b worker 0"])
    start = time.monotonic()
    with pytest.raises(BroadcastError, match=r"rank 2 \(server-b worker 0\)") as caught:
        sender.send(record, tensors)
    assert "rank 1" not in str(caught.value)
    assert time.monotonic() - start < TIMEOUT_S + 5
    for p in procs:
        p.join(TIMEOUT_S + 10)
        assert p.exitcode is not None  # the live receiver did not hang either


def spawn_sender(target, version: int, wait_s: float) -> tuple[Any, Any, Any]:
    """A spawned trainer running `target` on the model's tensors as `version` (its record comes
    back on the queue; it sends once `go` is set)."""
    ctx = mp.get_context("spawn")
    queue, go = ctx.Queue(), ctx.Event()
    args = (model_tensors(), version, BUCKET, wait_s, queue, go)
    trainer = ctx.Process(target=target, args=args, daemon=True)
    trainer.start()
    return trainer, queue, go


@pytest.mark.slow  # three spawned processes, 5-8 s
def test_receivers_name_the_trainer_when_it_is_killed_mid_way() -> None:
    trainer, queue, go = spawn_sender(sender_stalled_after_first_bucket, 5, TIMEOUT_S)
    try:
        record = queue.get(timeout=60)
        procs, out = start_receivers(record, {}, go)
        announce_peers(record, ["a", "b"])
        assert queue.get(timeout=60) == STALLED
        os.kill(trainer.pid, signal.SIGKILL)
        start = time.monotonic()
        results = [out.get(timeout=TIMEOUT_S + 30) for _ in procs]
        assert time.monotonic() - start < TIMEOUT_S + 10
    finally:
        trainer.kill()
        trainer.join(10)
    for _, status, message, _ in results:
        assert status == "error" and "the trainer (rank 0" in message
    for p in procs:
        p.join(10)


def publish(transport: Broadcast, out: Path, version: int) -> PublishedVersion:
    """What `Trainer.export` does with the exporting rank's transport (`export_version`):
    publish `version` of `model_tensors()` in `out` (its record, no tensor files), then start
    sending."""
    tensors = model_tensors()
    record = PublishedVersion.build(version, Broadcast.name, tensors, KEY)
    out.mkdir(parents=True)
    record = transport.publish(out, record, tensors)
    record.write(out)
    handoff.mark_published(out)
    transport.published(out, record, tensors)
    return record


def broadcast_to_one_receiver(transport: Broadcast, out: Path, version: int) -> PublishedVersion:
    """Publish `version` into `out` and send it to one receiver process; the orchestrator's
    verdict: every server got it. Returns the record as published."""
    publish(transport, out, version)
    record = PublishedVersion.read(out)
    assert record is not None and not list(out.glob("*.safetensors"))
    procs, results = start_receivers(record, {}, ranks=(1,))
    announce_peers(record, ["server-a worker 0"])
    assert results.get(timeout=60)[1] == "ok"
    assert finish_update(record, files_needed=False) is None
    procs[0].join(30)
    return record


@pytest.mark.slow  # two updates to a spawned receiver, 5-8 s
def test_a_server_restarting_between_updates_gets_the_last_version_as_files(
    tmp_path: Path,
) -> None:
    """Without this, a one-server broadcast run whose server restarts waits for an update that
    can never come (no server, no rollouts, no next batch)."""
    # no timeout is under test here: the receivers (spawned, importing torch) join within it
    # even on a loaded machine
    transport = Broadcast(TransportSettings(BroadcastParams(timeout_s=60, bucket_mb=1)))
    first = broadcast_to_one_receiver(transport, tmp_path / "step_1", 1)
    assert not (tmp_path / "step_1" / FILES_DIR).exists()  # nobody asked: nothing written
    path = request_files(first)  # the server restarted: the trainer writes version 1
    assert path == str(tmp_path / "step_1" / FILES_DIR) and handoff.is_published(Path(path))
    written = load_file(str(Path(path) / "model.safetensors"))
    for name, tensor in model_tensors():
        assert torch.equal(written[name], tensor)
    files = PublishedVersion.read(path)  # the same version, published as files
    assert files is not None and (files.transport, files.delivery) == ("filesystem", {})
    assert (files.version, files.tensors) == (first.version, first.tensors)
    assert mismatches(iter_safetensors(path), files, KEY) == []

    second = broadcast_to_one_receiver(transport, tmp_path / "step_2", 2)
    transport.settle()  # the trainer's next update (or its end) closes version 2
    start = time.monotonic()
    assert request_files(second) is None  # too late: the server joins the next broadcast
    assert time.monotonic() - start < 1
    assert not (tmp_path / "step_2" / FILES_DIR).exists()


@pytest.mark.slow  # a spawned trainer, ~5 s
def test_the_servers_cap_bounds_the_whole_receive_not_each_bucket() -> None:
    """A trainer sending each of three buckets 2 s late, each within the server's 3 s cap,
    would keep the engine paused ~6 s if the cap bounded each wait: the receive ends at 3 s."""
    cap, delay = 3.0, 2.0
    trainer, queue, go = spawn_sender(sender_trickling, 8, delay)
    try:
        record = queue.get(timeout=60)
        assert len(BroadcastDelivery.of(record).buckets) == 3
        go.set()
        announce_peers(record, ["server-a worker 0"])
        start = time.monotonic()
        with pytest.raises(BroadcastError, match="of 3 never arrived from the trainer"):
            for _ in receive(record, Reception(rank=1, timeout_s=cap)):
                pass
        assert time.monotonic() - start < cap + 1.5
    finally:
        trainer.kill()
        trainer.join(10)
