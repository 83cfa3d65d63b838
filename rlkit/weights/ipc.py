"""The ``ipc`` weight transport: trainer and engines on one host share one buffer.

The trainer's exporting rank packs the version's tensors into an anonymous shared-memory file
(`os.memfd_create`: it has no name in ``/dev/shm``, so a killed process leaves nothing behind,
and another user cannot open it) and publishes its handle in the record (`IpcDelivery`: the
trainer's pid, the descriptor, the buffer's name and the tensors' offsets). Each engine worker
opens ``/proc/<pid>/fd/<fd>`` after checking that it is that buffer, maps it read-only and
loads the tensors straight from the mapping: no socket, no file, no copy besides the load. The
record travels as JSON, never a pickle.

The trainer keeps a version's buffer until the orchestrator has delivered it to every server
(`handoff.mark_delivered`) and its next version is published, so a server that rejoins in
between loads the same buffer; waiting for that acknowledgement is bounded by the transport's
timeout. The next version is packed into the same buffer (its pages stay allocated: an update
costs a copy, not an allocation) unless a worker is still loading from it: a worker holds a
shared lock (`flock`) on the buffer from before it checks the bytes until it has loaded them
(until the last of the tensors it received is freed), so the bytes it loads are the bytes it
checked; the trainer refills only under an exclusive lock it gets at once, else it packs the
version into a new buffer. A worker keeps its mapping of the newest buffer between updates (a
shared, read-only mapping sees each refill: the next update's check and load touch no new page,
where mapping afresh faulted every page in again: `bench_weight_update.py`'s worker check) and
lets it go when a record names another buffer, so an abandoned buffer's pages live until that
worker's next ipc update or exit. A worker still holding an older record then reads bytes its
tensor table refuses, or is refused while the trainer writes. On a GPU host the buffer is host
memory, which the workers copy to their devices as they load (CUDA IPC handles between a trainer
and an engine sharing one GPU are not built).
"""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import secrets
import time
import warnings
import weakref
from pathlib import Path
from typing import ClassVar

import numpy
import torch
from pydantic import BaseModel, ConfigDict

from rlkit.errors import RunStopped
from rlkit.lifetime import process_alive
from rlkit.protocol import handoff
from rlkit.protocol.weights import (
    Named,
    PublishedVersion,
    TensorEntry,
    packed_offsets,
    raw_bytes,
)
from rlkit.weights.transport import (
    TRANSPORTS,
    ModelFiles,
    Outcome,
    Reception,
    ServerAdmin,
    TimeoutParams,
    TransportSettings,
    outcome_of,
    params_as,
)


class TrainerGone(RunStopped):
    """The trainer that holds a version's buffer exited before the servers loaded it."""


class IpcError(RuntimeError):
    """A worker could not map a version's buffer (the trainer let it go, or it is not the one
    the record names)."""


class IpcDelivery(BaseModel):
    """An ipc version's handle: where its buffer is and where each tensor starts in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int
    fd: int
    name: str  # the memfd's name, with a random part: a reused descriptor number is refused
    size: int
    offsets: list[int]

    @classmethod
    def of(cls, record: PublishedVersion) -> IpcDelivery:
        return cls.model_validate(record.delivery)


class SharedBuffer:
    """Packed tensors in a memfd owned by this process (one version's at a time)."""

    def __init__(self, size: int) -> None:
        self.name = f"rlkit-weights-{secrets.token_hex(8)}"
        self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        self.size = max(size, 1)
        os.ftruncate(self.fd, self.size)
        self.mapped: torch.Tensor | None = None  # our own writable mapping, from the first refill

    def fill(self, tensors: list[Named], offsets: list[int]) -> None:
        """Write each tensor's bytes at its offset, but for those already there (cast into the
        buffer by the gather: `Ipc.destination`). The first fill writes plainly into the file
        (allocating its pages: faulting them in through a new mapping was slower, 40 ms a MB
        beside a vLLM worker's mapping once); a refill copies through our own mapping of the
        pages that now exist (made once, populated in bulk): a plain copy's speed, where the
        writes took 1.4-1.7x a copy (issue 63)."""
        if self.mapped is None:
            for (_, tensor), offset in zip(tensors, offsets, strict=True):
                view, done = memoryview(raw_bytes(tensor).numpy()), 0
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], offset + done)
            return
        for (_, tensor), offset in zip(tensors, offsets, strict=True):
            raw = raw_bytes(tensor)
            into = self.mapped[offset : offset + raw.numel()]
            if raw.data_ptr() != into.data_ptr():
                into.copy_(raw)

    def lock(self) -> bool:
        """Take the exclusive lock at once (mapping the buffer for our writes the first time),
        unless a worker is still loading from it (it holds a shared lock until it has loaded
        what it checked): False then."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if self.mapped is None:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mapped = torch.frombuffer(mmap.mmap(self.fd, self.size, flags), dtype=torch.uint8)
        return True

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def refill(self, tensors: list[Named], offsets: list[int]) -> bool:
        """Fill again under the exclusive lock; False, nothing written, when it is not free."""
        if not self.lock():
            return False
        try:
            self.fill(tensors, offsets)
        finally:
            self.unlock()
        return True

    def views(self, table: list[TensorEntry], offsets: list[int]) -> dict[str, torch.Tensor]:
        """Writable views of the tensors `table` packs at `offsets`, by name (while locked)."""
        assert self.mapped is not None
        return {
            e.name: self.mapped[o : o + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape)
            for e, o in zip(table, offsets, strict=True)
        }

    def close(self) -> None:
        self.mapped = None  # the mapping goes with the last view of it
        os.close(self.fd)


class KeptMapping:
    """A worker's read-only mapping of one trainer buffer, kept between updates (module doc).
    Made from a descriptor that is never locked: the per-update lock is on a descriptor of its
    own, so keeping the mapping holds no lock."""

    def __init__(self, delivery: IpcDelivery, fd: int) -> None:
        self.key = (delivery.pid, delivery.name, delivery.size)
        self.mapping = mmap.mmap(fd, delivery.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)

    def locked_bytes(self, lock_fd: int) -> torch.Tensor:
        """The whole buffer as uint8, holding `lock_fd` (and its shared lock) open until the
        last view of it is freed."""
        array = numpy.frombuffer(self.mapping, dtype=numpy.uint8)  # a new owner per update
        weakref.finalize(array, os.close, lock_fd)
        with warnings.catch_warnings():  # read-only by design: a write faults, nothing changes
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)


_kept: KeptMapping | None = None  # this worker's mapping of the newest buffer it loaded from


def open_shared(record: PublishedVersion) -> list[Named]:
    """A worker's side: the record's tensors as read-only views of the trainer's buffer (the
    trainer's bytes cannot be changed from here: a write faults), under a shared lock that
    lasts until the last view is freed (the trainer does not refill a buffer a worker loads
    from: the bytes loaded are the bytes checked). IpcError when the buffer is gone, is being
    refilled, or the descriptor is not the buffer the record names."""
    global _kept
    d = IpcDelivery.of(record)
    path = f"/proc/{d.pid}/fd/{d.fd}"
    trainer = f"the trainer (pid {d.pid})"
    gone = IpcError(
        f"version {record.version}: {trainer} no longer holds its buffer {d.name} (it "
        "exited or moved on to the next version, or the record names another descriptor)"
    )
    expected = f"/memfd:{d.name} (deleted)"  # a reused descriptor number is another file
    try:
        if os.readlink(path) != expected:
            raise gone
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        raise gone from None
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != expected:  # replaced since the check
            raise gone
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IpcError(
                f"version {record.version}: {trainer} is writing its next version into {d.name}"
            ) from None
        if _kept is None or _kept.key != (d.pid, d.name, d.size):
            _kept = None  # the buffer before goes with the last view of it
            unlocked = os.open(path, os.O_RDONLY)  # the mapping's own, never locked
            try:
                _kept = KeptMapping(d, unlocked)
            finally:
                os.close(unlocked)
        buffer = _kept.locked_bytes(fd)  # from here on the views own `fd` and its lock
    except BaseException:
        os.close(fd)
        raise
    return [
        (e.name, buffer[o : o + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape))
        for e, o in zip(record.tensors, d.offsets, strict=True)
    ]


def layout(table: list[TensorEntry]) -> list[tuple[str, str, tuple[int, ...]]]:
    """Where a table puts each tensor in a buffer: its names, dtypes and shapes in order."""
    return [(e.name, e.dtype, tuple(e.shape)) for e in table]


@TRANSPORTS.register("ipc", params=TimeoutParams)
class Ipc:
    """The transport's three sides (module doc)."""

    name: ClassVar[str] = "ipc"
    carries_adapters: ClassVar[bool] = False  # full weights only

    def __init__(self, settings: TransportSettings, model_files: ModelFiles | None = None) -> None:
        self.params = params_as(TimeoutParams, settings)
        self.current: tuple[Path | None, SharedBuffer] | None = None  # (its directory, buffer)
        self.spare: SharedBuffer | None = None  # a settled version's buffer, to fill again
        self.reserved: SharedBuffer | None = None  # the spare, locked since `destination`
        self.table: list[TensorEntry] = []  # the newest version's tensor table: its layout

    def destination(self) -> dict[str, torch.Tensor] | None:
        """Before a version is gathered: the settled buffer's tensors at the newest version's
        layout, by name, for the gather to cast straight into (the version's one write: nothing
        is gathered into new tensors and then packed), under the exclusive lock until `publish`.
        None where there is nothing to fill again: the first version, the newest one not yet
        delivered (settling would wait for it here, before the gather, not beside it), or a
        worker still loading from the buffer."""
        if self.reserved is None:
            if self.current is not None:
                out = self.current[0]
                if out is None or not handoff.is_delivered(out):
                    return None
                self.settle()  # delivered: no wait
            spare = self.spare
            if spare is None or not self.table or not spare.lock():
                return None
            self.spare, self.reserved = None, spare
        return self.reserved.views(self.table, packed_offsets(self.table)[0])

    def publish(
        self, tmp: Path, record: PublishedVersion, tensors: list[Named]
    ) -> PublishedVersion:
        offsets, size = packed_offsets(record.tensors)
        reserved, self.reserved = self.reserved, None
        if reserved is not None and layout(record.tensors) == layout(self.table):
            try:
                reserved.fill(tensors, offsets)  # those the gather did not cast into it
            finally:
                reserved.unlock()
            shared = reserved
        else:
            self.settle()
            shared = self._filled(tensors, offsets, size)
            if reserved is not None:  # another layout: the gather's writes there are copied
                reserved.close()
        self.current, self.table = (None, shared), record.tensors
        delivery = IpcDelivery(
            pid=os.getpid(), fd=shared.fd, name=shared.name, size=shared.size, offsets=offsets
        )
        return record.model_copy(update={"delivery": delivery.model_dump()})

    def _filled(self, tensors: list[Named], offsets: list[int], size: int) -> SharedBuffer:
        """The settled buffer filled again when it has the size and no worker loads from it;
        else a new buffer (the old one's pages go when the last worker lets its mapping go)."""
        spare, self.spare = self.spare, None
        if spare is not None:
            if spare.size == max(size, 1) and spare.refill(tensors, offsets):
                return spare
            spare.close()
        shared = SharedBuffer(size)
        shared.fill(tensors, offsets)
        return shared

    def published(self, out: Path, record: PublishedVersion, tensors: list[Named]) -> None:
        assert self.current is not None
        self.current = (out, self.current[1])

    def settle(self) -> None:
        """Wait (bounded) until the orchestrator delivered the newest buffer; from then on it
        is the spare the next version fills again when no worker loads from it (its pages
        stay: no new allocation, no page zeroing per update). A worker that opens it later gets
        that next version's bytes, which its record's tensor table refuses."""
        if self.current is None:
            return
        out, shared = self.current
        deadline = time.monotonic() + self.params.timeout_s
        while out is not None and not handoff.is_delivered(out):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if self.spare is not None:
            self.spare.close()
        self.spare, self.current = shared, None

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        return open_shared(record)

    @classmethod
    async def deliver(
        cls, servers: list[ServerAdmin], directory: str, record: PublishedVersion
    ) -> list[Outcome]:
        """Every server maps the buffer. When the trainer is gone (one host: its pid tells)
        the run stops resumably instead: no server can load the version."""
        pid = IpcDelivery.of(record).pid
        if not process_alive(pid):
            raise TrainerGone(
                f"the trainer (pid {pid}) exited before policy version {record.version} reached "
                "the servers; its latest checkpoint stays: continue with --resume"
            )
        results = await asyncio.gather(
            *(s.update_weights(directory, record.version) for s in servers),
            return_exceptions=True,
        )
        handoff.mark_delivered(Path(directory))
        return [outcome_of(r) for r in results]

    @classmethod
    async def catch_up(cls, server: ServerAdmin, directory: str, record: PublishedVersion) -> bool:
        """The same buffer while the trainer holds it; False once it moved on (the server
        then joins the next update)."""
        from rlkit.errors import InferenceError

        try:
            await server.update_weights(directory, record.version)
        except InferenceError as exc:
            if exc.status is None:
                raise
            return False
        return True
