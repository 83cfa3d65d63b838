"""How a published policy version travels from the trainer to the engines: `WeightTransport`s.

`[inference] weight_transfer` names a registered transport (`TRANSPORTS`), an installed entry
point (group ``rlkit.weight_transports``) or the user's own class (``"my_pkg.mod:MyTransport"``).
Built in:

- ``filesystem`` (`rlkit.weights.filesystem`): HF safetensors under ``run_dir/weights/step_N``;
  also the checkpoint format and what a server that rejoins loads.
- ``broadcast`` (`rlkit.weights.broadcast`): a gloo (CPU) / NCCL (CUDA) process group from the
  trainer's exporting rank to every engine worker, bounded buckets, a timeout on every wait.
- ``ipc`` (`rlkit.weights.ipc`): trainer and engines on one host share one buffer of the packed
  tensors (an anonymous shared-memory file the workers map); nothing is copied through sockets
  or files.

A transport is one class with three sides, so a new one is one file and no edit of rlkit:

- the trainer's exporting rank (an instance, built from `TransportSettings`): `publish` makes the
  version's tensors reachable inside its directory before it is marked published and returns
  the `PublishedVersion` with its delivery fields; `published` runs after (a broadcast starts
  sending); `settle` waits for the update in flight (before the next one, and at exit).
- an engine worker (`receive`, a classmethod): the tensors of a verified record; the worker
  then checks them against the record's tensor table and loads them (`rlkit.inference.worker_ext`).
- the orchestrator (`deliver` and `catch_up`, classmethods): bring a set of servers, or one that
  rejoins, to the version, through their admin clients (`rlkit.inference.admin`).

`weight_transfer = "auto"` is ``filesystem``. Whatever the transport, the orchestrator owns when
an update happens and checks it afterwards with the logprob canary (`rlkit.inference.canary`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from pydantic import BaseModel

from rlkit.protocol.weights import Named, PublishedVersion
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.inference.admin import AdminClient

ModelFiles = Callable[[Path], None]  # writes an HF model's config and tokenizer into a directory


@dataclass(frozen=True)
class TransportSettings:
    """What the trainer's side of a transport is built from (`[inference]`, via the trainer)."""

    timeout_s: float = 120.0  # every wait and collective of one update
    bucket_mb: int = 1024  # broadcast: most MiB per collective
    device: str = "cpu"  # where the exporting rank's tensors live
    host: str = "127.0.0.1"  # where the exporting rank is reachable from the engines


@dataclass
class Outcome:
    """What one server's update came to: loaded, or why not (the pool then drops the server
    until it rejoins). `answered`: the server answered (it refused or missed the update and
    keeps its old version) rather than not at all."""

    loaded: bool
    answered: bool = True
    error: str = ""


class WeightTransport(Protocol):
    """The three sides of one way to move weights (module doc)."""

    name: ClassVar[str]

    def __init__(self, settings: TransportSettings, model_files: ModelFiles) -> None: ...

    def publish(
        self, tmp: Path, record: PublishedVersion, tensors: list[Named]
    ) -> PublishedVersion:
        """Inside the version's directory, before it is published: make `tensors` reachable."""
        ...

    def published(self, out: Path, record: PublishedVersion, tensors: list[Named]) -> None:
        """After the directory at `out` is published (e.g. start sending)."""
        ...

    def settle(self) -> None:
        """Let the update in flight finish (before the next one and at exit), bounded."""
        ...

    @classmethod
    def receive(cls, record: PublishedVersion, directory: Path, rank: int) -> list[Named]:
        """On an engine worker: the version's tensors (checked by the caller)."""
        ...

    @classmethod
    async def deliver(
        cls, servers: list[AdminClient], directory: str, record: PublishedVersion
    ) -> list[Outcome]:
        """On the orchestrator: bring every server in `servers` to the version."""
        ...

    @classmethod
    async def catch_up(cls, server: AdminClient, directory: str, record: PublishedVersion) -> bool:
        """On the orchestrator: bring one server that rejoins to the version; False when it
        must wait for the next update instead."""
        ...


EXIT_MID_UPDATE_ENV = "RLKIT_TEST_EXIT_MID_UPDATE"  # "RANK:VERSION": a worker dies mid-update


def exit_mid_update(rank: int, version: int) -> None:
    """Test hook: the worker of `rank` exits while it receives `version` (a server killed
    mid-update), when `EXIT_MID_UPDATE_ENV` says so."""
    if os.environ.get(EXIT_MID_UPDATE_ENV) == f"{rank}:{version}":
        os._exit(1)


TRANSPORTS: Registry[type[WeightTransport]] = Registry(
    "weight transport", "rlkit.weight_transports", BaseModel, form="module:Class"
)
PROTOCOL_METHODS = ("publish", "published", "settle", "receive", "deliver", "catch_up")


def transport_class(name: str) -> type[WeightTransport]:
    """The transport `name` names ("auto" is filesystem); ValueError when it is unknown or not
    a `WeightTransport`."""
    _register_builtins()
    cls = TRANSPORTS.get("filesystem" if name == "auto" else name).fn
    missing = [m for m in PROTOCOL_METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(
            f"weight transport {name!r} is not a WeightTransport class (rlkit.weights."
            f"WeightTransport): it lacks {', '.join(missing) or 'a class'}"
        )
    return cls


def _register_builtins() -> None:
    """Import the built-ins (they register themselves); kept lazy so that importing this
    module stays cheap for the worker and the orchestrator."""
    import rlkit.weights.broadcast  # noqa: F401
    import rlkit.weights.filesystem  # noqa: F401
    import rlkit.weights.ipc  # noqa: F401
