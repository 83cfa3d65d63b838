"""The weight transport contract (`WeightTransport`), its registry and shared records; the
built-in transports and the lookup are in `rlkit.weights`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from rlkit.protocol.weights import Named, PublishedVersion
from rlkit.registry import Registry

ModelFiles = Callable[[Path], None]  # writes an HF model's config and tokenizer into a directory


@dataclass(frozen=True)
class TransportSettings:
    """What the trainer's side of a transport is built from (`[inference]`, via the trainer)."""

    timeout_s: float = 120.0  # every wait and collective of one update
    bucket_mb: int = 1024  # broadcast: most MiB per collective
    device: str = "cpu"  # where the exporting rank's tensors live
    host: str = "127.0.0.1"  # where the exporting rank is reachable from the engines
    token: str | None = field(default=None, repr=False)  # the run's credential: signs records


@dataclass(frozen=True)
class Reception:
    """What a server gives its workers' `receive` beyond the (verified) record."""

    rank: int = 0  # this worker's rank in a broadcast group
    timeout_s: float = 300.0  # the longest it may wait: the server's cap on any update
    secret: str = ""  # the run's rendezvous secret, derived from the caller's token


@dataclass
class Outcome:
    """What one server's update came to: loaded, or why not (the pool then drops the server
    until it rejoins). `answered`: the server answered (it refused or missed the update and
    keeps its old version) rather than not at all."""

    loaded: bool
    answered: bool = True
    error: str = ""


class ServerAdmin(Protocol):
    """What a transport's orchestrator side may ask of a server (`rlkit.inference.admin`)."""

    base_url: str
    token: str | None  # the run's credential it calls with

    async def status(self) -> dict[str, Any]: ...

    async def update_weights(
        self,
        path: str,
        version: int | None = None,
        *,
        rank: int = 0,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> int: ...


class WeightTransport(Protocol):
    """The three sides of one way to move weights (module doc)."""

    name: ClassVar[str]
    # a LoRA run may use it: its adapters go as files whatever the transport (`carries_adapters`)
    carries_adapters: ClassVar[bool]

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
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        """On an engine worker: the version's tensors (checked by the caller)."""
        ...

    @classmethod
    async def deliver(
        cls, servers: list[ServerAdmin], directory: str, record: PublishedVersion
    ) -> list[Outcome]:
        """On the orchestrator: bring every server in `servers` to the version."""
        ...

    @classmethod
    async def catch_up(cls, server: ServerAdmin, directory: str, record: PublishedVersion) -> bool:
        """On the orchestrator: bring one server that rejoins to the version; False when it
        must wait for the next update instead."""
        ...


EXIT_MID_UPDATE_ENV = "RLKIT_TEST_EXIT_MID_UPDATE"  # "RANK:VERSION[:ONCE_FILE]"


def exit_mid_update(rank: int, version: int) -> None:
    """Test hook: the worker of `rank` exits while it receives `version` (a server killed
    mid-update), when `EXIT_MID_UPDATE_ENV` says so; with a third field, only the first time
    (the file it names is created then), so a relaunched server can load that version."""
    rank_s, version_s, *once = os.environ.get(EXIT_MID_UPDATE_ENV, "").split(":", 2) + [""]
    if (rank_s, version_s) != (str(rank), str(version)):
        return
    if once and once[0]:
        try:
            os.close(os.open(once[0], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    os._exit(1)


TRANSPORTS: Registry[type[WeightTransport]] = Registry(
    "weight transport", "rlkit.weight_transports", BaseModel, form="module:Class"
)
