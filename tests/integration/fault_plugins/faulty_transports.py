"""Weight transports that fail on purpose, registered by the tests that need a fault (a tensor
altered in flight, a worker killed mid-update): rlkit's own transports, requests and worker RPC
carry no test hooks. A test puts this folder on PYTHONPATH (`FAULT_PLUGINS`) and names a class
here as the record's or the run's transport (``faulty_transports:CorruptingBroadcast``), so the
server's workers, the trainer and the orchestrator all load it as they would a user's own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from rlkit.protocol.weights import Named, PublishedVersion
from rlkit.weights.broadcast import Broadcast, BroadcastParams
from rlkit.weights.filesystem import Filesystem
from rlkit.weights.ipc import Ipc
from rlkit.weights.transport import TRANSPORTS, Reception, TimeoutParams

CORRUPTED = "model.layers.1.mlp.down_proj.weight"  # the tensor altered in flight


def corrupted(tensors: list[Named]) -> list[Named]:
    """`tensors` with one element of `CORRUPTED` changed, as a fault in flight would."""
    out = []
    for name, tensor in tensors:
        if name == CORRUPTED:
            tensor = tensor.clone()
            tensor.view(-1)[tensor.numel() // 2] += 1
        out.append((name, tensor))
    return out


@TRANSPORTS.register("faulty_transports:CorruptingFilesystem")
class CorruptingFilesystem(Filesystem):
    """Files, with `CORRUPTED` altered after the worker read it."""

    name: ClassVar[str] = "faulty_transports:CorruptingFilesystem"

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        return corrupted(super().receive(record, directory, reception))


@TRANSPORTS.register("faulty_transports:CorruptingBroadcast", params=BroadcastParams)
class CorruptingBroadcast(Broadcast):
    """A broadcast, with `CORRUPTED` altered after its bucket arrived."""

    name: ClassVar[str] = "faulty_transports:CorruptingBroadcast"

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        return corrupted(super().receive(record, directory, reception))


@TRANSPORTS.register("faulty_transports:BroadcastKilledMidUpdate", params=BroadcastParams)
class BroadcastKilledMidUpdate(Broadcast):
    """A broadcast whose rank 2 (the second server's worker) exits once the first bucket of
    version 2 arrived: a server killed mid-update."""

    name: ClassVar[str] = "faulty_transports:BroadcastKilledMidUpdate"

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        tensors: list[Named] = []
        for bucket in cls.receiver.receive(record, reception):
            tensors += bucket
            if (reception.rank, record.version) == (2, 2):
                os._exit(1)
        return tensors


@TRANSPORTS.register("faulty_transports:IpcKilledOnce", params=TimeoutParams)
class IpcKilledOnce(Ipc):
    """ipc, whose rank 0 exits once it mapped version 2's buffer, the first time only (it then
    creates ``killed-once`` in the run directory), so the relaunched server loads version 2."""

    name: ClassVar[str] = "faulty_transports:IpcKilledOnce"

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        tensors = super().receive(record, directory, reception)
        if (reception.rank, record.version) == (0, 2):
            try:  # the version's directory is run_dir/weights/step_N
                os.close(os.open(directory.parents[1] / "killed-once", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return tensors
            os._exit(1)
        return tensors
