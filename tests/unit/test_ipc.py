"""The ``ipc`` weight transport without an engine: the trainer's side packs a version into an
anonymous shared-memory buffer, another process (a worker's side) maps it from the handle in
the record and gets exactly the published tensors; a buffer the trainer let go, or a
descriptor that is not the named buffer, is refused; a trainer or worker SIGKILLed mid-update
leaves no hang and nothing in /dev/shm."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from rlkit.protocol import handoff
from rlkit.protocol.weights import PublishedVersion, mismatches
from rlkit.weights import Reception, TransportSettings, transport_class
from rlkit.weights import ipc as ipc_module
from rlkit.weights.ipc import Ipc, IpcDelivery, IpcError, open_shared
from rlkit.weights.transport import TimeoutParams

KEY = bytes(range(32))  # the key of the tensor tags (a run derives it from its token)

TENSORS = [
    ("embed.weight", torch.randn(37, 16).to(torch.bfloat16)),
    ("norm.weight", torch.ones(16)),
    ("odd.bytes", torch.arange(7, dtype=torch.uint8)),
]


def shm_entries() -> set[str]:
    """/dev/shm's files that a weight buffer could leave: rlkit's own names and torch's
    shared-memory files (other processes' semaphores and torch managers on a shared machine
    come and go and are not ours)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if "rlkit" in n or n.startswith("torch_")}


def reversed_tensors() -> list[tuple[str, torch.Tensor]]:
    """The next version: the same names, shapes and dtypes, other values."""
    return [(n, t.flip(0).contiguous() if t.dim() else t) for n, t in TENSORS]


def publish(tmp: Path, version: int = 1, timeout_s: float = 5.0) -> tuple[Ipc, PublishedVersion]:
    ipc = Ipc(TransportSettings(TimeoutParams(timeout_s=timeout_s)))
    record = PublishedVersion.build(version, "ipc", TENSORS, KEY)
    record = ipc.publish(tmp, record, TENSORS)
    ipc.published(tmp, record, TENSORS)
    return ipc, record


def worker_check(record_json: str, queue: mp.Queue) -> None:
    """A worker's side in another process: map, check against the table."""
    record = PublishedVersion.model_validate_json(record_json)
    try:
        tensors = Ipc.receive(record, Path("."), Reception())
        queue.put(mismatches(tensors, record, KEY))
    except IpcError as exc:
        queue.put(f"IpcError: {exc}")


def in_worker(record: PublishedVersion) -> object:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=worker_check, args=(record.model_dump_json(), queue))
    proc.start()
    try:
        return queue.get(timeout=60)
    finally:
        proc.join(30)


def test_ipc_is_a_registered_transport() -> None:
    assert transport_class("ipc") is Ipc


@pytest.mark.slow  # spawns processes that import torch
def test_another_process_maps_exactly_the_published_tensors(tmp_path: Path) -> None:
    before = shm_entries()
    ipc, record = publish(tmp_path)
    delivery = IpcDelivery.of(PublishedVersion.model_validate_json(record.model_dump_json()))
    assert delivery.pid == os.getpid() and delivery.size >= record.nbytes
    assert in_worker(record) == []  # every tensor arrived, digests equal
    assert shm_entries() == before  # a memfd has no name in /dev/shm
    handoff.mark_delivered(tmp_path)
    ipc.settle()  # delivered: the buffer waits for the next version
    newer = PublishedVersion.build(2, "ipc", reversed_tensors(), KEY)
    newer = ipc.publish(tmp_path, newer, reversed_tensors())
    assert IpcDelivery.of(newer).fd == delivery.fd  # the same pages, filled again
    stale = in_worker(record)  # a worker still holding version 1's record
    assert isinstance(stale, list) and stale, "version 2's bytes passed version 1's table"
    assert in_worker(newer) == []


def worker_writes(record_json: str) -> None:
    """A worker scribbling on the view it received."""
    record = PublishedVersion.model_validate_json(record_json)
    open_shared(record)[0][1].zero_()


@pytest.mark.slow  # spawns a process that imports torch
def test_the_read_only_mapping_cannot_change_the_trainers_bytes(tmp_path: Path) -> None:
    ipc, record = publish(tmp_path)
    try:
        worker = mp.get_context("spawn").Process(
            target=worker_writes, args=(record.model_dump_json(),)
        )
        worker.start()
        worker.join(60)
        assert worker.exitcode == -signal.SIGSEGV  # the write faults
        assert mismatches(open_shared(record), record, KEY) == []
    finally:
        handoff.mark_delivered(tmp_path)
        ipc.settle()


def test_a_worker_keeps_its_mapping_and_sees_each_refill(tmp_path: Path) -> None:
    """The next update's tensors come from the mapping the worker already has (no page
    faulted in again): the trainer's refill shows through it, and a record of another buffer
    replaces it."""
    ipc, record = publish(tmp_path)
    assert mismatches(open_shared(record), record, KEY) == []
    kept = ipc_module._kept
    handoff.mark_delivered(tmp_path)
    ipc.settle()
    newer = PublishedVersion.build(2, "ipc", reversed_tensors(), KEY)
    newer = ipc.publish(tmp_path, newer, reversed_tensors())
    assert IpcDelivery.of(newer).name == IpcDelivery.of(record).name  # filled again
    assert mismatches(open_shared(newer), newer, KEY) == []
    assert ipc_module._kept is kept  # the same mapping, the new bytes
    assert mismatches(open_shared(record), record, KEY)  # the old record's table refuses them
    handoff.mark_delivered(tmp_path)
    ipc.settle()
    _, other = publish(tmp_path / "other", version=3)  # another trainer's buffer
    assert mismatches(open_shared(other), other, KEY) == []
    assert ipc_module._kept is not kept and ipc_module._kept.key[1] == IpcDelivery.of(other).name


def test_a_buffer_a_worker_still_maps_is_not_refilled(tmp_path: Path) -> None:
    """A worker that checked version 1 and loads it late (a rejoining server, or one slower than
    the trainer's settle timeout) loads version 1's bytes, not the next version's: the trainer
    packs version 2 into a new buffer while the old one is mapped, and fills the same buffer
    again once nobody maps it."""
    ipc, record = publish(tmp_path)
    held = open_shared(record)  # checked, not loaded yet
    assert mismatches(held, record, KEY) == []
    handoff.mark_delivered(tmp_path)
    ipc.settle()
    newer = PublishedVersion.build(2, "ipc", reversed_tensors(), KEY)
    newer = ipc.publish(tmp_path, newer, reversed_tensors())
    assert mismatches(held, record, KEY) == []  # what it loads is what it checked
    assert IpcDelivery.of(newer).name != IpcDelivery.of(record).name
    del held  # loaded: the mapping and its lock go
    handoff.mark_delivered(tmp_path)
    ipc.settle()
    third = ipc.publish(tmp_path, record.model_copy(update={"version": 3}), TENSORS)
    assert IpcDelivery.of(third).name == IpcDelivery.of(newer).name  # filled again
    assert mismatches(open_shared(third), third, KEY) == []
    handoff.mark_delivered(tmp_path)
    ipc.settle()


def test_a_worker_is_refused_while_the_trainer_refills_the_buffer(tmp_path: Path) -> None:
    import fcntl

    ipc, record = publish(tmp_path)
    try:
        d = IpcDelivery.of(record)
        writer = os.open(f"/proc/self/fd/{d.fd}", os.O_RDONLY)  # the trainer's lock, as held
        fcntl.flock(writer, fcntl.LOCK_EX)
        with pytest.raises(IpcError, match="is writing its next version"):
            open_shared(record)
        os.close(writer)
        assert mismatches(open_shared(record), record, KEY) == []
    finally:
        handoff.mark_delivered(tmp_path)
        ipc.settle()


def test_a_record_naming_another_descriptor_is_refused(tmp_path: Path) -> None:
    ipc, record = publish(tmp_path)
    try:
        other = os.open(tmp_path, os.O_RDONLY)  # a descriptor of the trainer that is no buffer
        forged = record.model_copy(update={"delivery": {**record.delivery, "fd": other}})
        with pytest.raises(IpcError, match="no longer holds its buffer"):
            open_shared(forged)
        os.close(other)
    finally:
        handoff.mark_delivered(tmp_path)
        ipc.settle()


def test_settle_waits_for_delivery_but_not_forever(tmp_path: Path) -> None:
    ipc, record = publish(tmp_path, timeout_s=0.5)
    start = time.monotonic()
    ipc.settle()  # nobody marks it delivered: bounded by the transport's timeout
    assert 0.4 < time.monotonic() - start < 5
    assert ipc.current is None and ipc.spare is not None  # settled: kept to fill again


def trainer_publishes_then_hangs(tmp: str, queue: mp.Queue) -> None:
    _, record = publish(Path(tmp))
    queue.put(record.model_dump_json())
    time.sleep(600)


@pytest.mark.slow  # spawns processes that import torch
def test_a_trainer_killed_mid_update_leaves_no_hang_and_nothing_in_dev_shm(
    tmp_path: Path,
) -> None:
    before = shm_entries()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    trainer = ctx.Process(target=trainer_publishes_then_hangs, args=(str(tmp_path), queue))
    trainer.start()
    record = PublishedVersion.model_validate_json(queue.get(timeout=60))
    assert in_worker(record) == []  # while the trainer holds it
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.join(30)
    start = time.monotonic()
    result = in_worker(record)
    assert isinstance(result, str) and f"the trainer (pid {trainer.pid})" in result
    assert time.monotonic() - start < 30  # refused at once, no wait
    assert shm_entries() == before


def worker_maps_then_dies(record_json: str) -> None:
    record = PublishedVersion.model_validate_json(record_json)
    open_shared(record)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow  # spawns processes that import torch
def test_a_worker_killed_mid_update_leaves_no_hang_and_nothing_in_dev_shm(
    tmp_path: Path,
) -> None:
    before = shm_entries()
    ipc, record = publish(tmp_path, timeout_s=1.0)
    ctx = mp.get_context("spawn")
    worker = ctx.Process(target=worker_maps_then_dies, args=(record.model_dump_json(),))
    worker.start()
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL
    start = time.monotonic()
    ipc.settle()  # never delivered: the trainer lets the buffer go after its timeout
    assert time.monotonic() - start < 5
    assert shm_entries() == before


@pytest.mark.parametrize("reaped", [True, False])
def test_delivering_a_version_whose_trainer_exited_stops_the_run_resumably(
    tmp_path: Path, reaped: bool
) -> None:
    """The orchestrator's side: no server is asked to map a buffer whose holder is gone (also
    while the killed trainer is a zombie its launcher has not reaped yet); the run stops with a
    RunStopped naming the trainer and --resume."""
    import asyncio
    import subprocess
    import sys

    from rlkit.errors import RunStopped
    from rlkit.weights.ipc import TrainerGone

    ipc, record = publish(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        if reaped:
            gone.wait()
        else:  # exited, not waited for
            stat = Path(f"/proc/{gone.pid}/stat")
            while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
                time.sleep(0.01)
        orphan = record.model_copy(update={"delivery": {**record.delivery, "pid": gone.pid}})

        class Unreachable:  # a server the transport must not call
            base_url, token = "http://unused", None

            async def update_weights(self, *args: object, **kwargs: object) -> int:
                raise AssertionError("a server was asked to load a gone trainer's buffer")

        with pytest.raises(TrainerGone, match=f"pid {gone.pid}.*--resume") as stopped:
            asyncio.run(Ipc.deliver([Unreachable()], str(tmp_path), orphan))
        assert isinstance(stopped.value, RunStopped)
    finally:
        gone.wait()
        handoff.mark_delivered(tmp_path)
        ipc.settle()
