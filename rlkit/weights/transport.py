"""The weight transport contract (`WeightTransport`), its registry, its parameter models and
the records every transport shares (`Outcome`, `load_files`); the built-in transports and the
lookup are in `rlkit.weights`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from pydantic import Field

from rlkit.config import Config
from rlkit.errors import InferenceError
from rlkit.protocol.weights import Digester, Named, PublishedVersion
from rlkit.registry import Registry

if TYPE_CHECKING:
    import torch

ModelFiles = Callable[[Path], None]  # writes an HF model's config and tokenizer into a directory


class TransportParams(Config):
    """A transport's own parameters (`[inference.transfer_params]`, passed to the trainer as
    they are), none by default; a transport registers its model with
    `TRANSPORTS.register(name, params=Model)`, which subclasses this one."""


class TimeoutParams(TransportParams):
    """The parameters of a transport whose trainer side waits for the servers."""

    timeout_s: float = Field(
        120.0,
        gt=0,
        description="Timeout of every wait and collective of one update (broadcast: a dead "
        "peer is named within it; ipc: how long the trainer keeps a version's buffer for a "
        "server that has not loaded it).",
    )


@dataclass(frozen=True)
class TransportSettings:
    """What the trainer's side of a transport is built from: its parameters (validated by the
    model it registered) and where the trainer runs."""

    params: TransportParams = field(default_factory=TransportParams)
    device: str = "cpu"  # where the exporting rank's tensors live
    host: str = "127.0.0.1"  # where the exporting rank is reachable from the engines
    token: str | None = field(default=None, repr=False)  # the run's credential: signs records


P = TypeVar("P", bound=TransportParams)


def params_as(model: type[P], settings: TransportSettings) -> P:
    """`settings.params` as the transport's own model `model` (its defaults where the settings
    were built without them, as a benchmark's may be)."""
    params = settings.params
    return params if isinstance(params, model) else model.model_validate(params.model_dump())


@dataclass(frozen=True)
class Reception:
    """What a server gives its workers' `receive` beyond the (verified) record. `digester`
    (set by the worker for the record's nonce, never sent): a transport that gets tensors one
    after another may hand each to it as it arrives (`arrived`; private memory that nothing
    changes afterwards), so the check's tags run while the rest arrives; the worker checks
    every tensor anyway."""

    rank: int = 0  # this worker's rank in a broadcast group
    timeout_s: float = 300.0  # the longest it may wait: the server's cap on any update
    secret: str = ""  # the run's rendezvous secret, derived from the caller's token
    digest_key: str = ""  # hex key the table's tag keys come from, derived from the caller's token
    digester: Digester | None = field(default=None, compare=False, repr=False)

    def arrived(self, tensors: Iterable[Named]) -> None:
        """Hand tensors that just arrived to the worker's digester, if any."""
        if self.digester is not None:
            for name, tensor in tensors:
                self.digester.add(tensor, name)


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

    # Optional (`destination_of`): def destination(self) -> dict[str, torch.Tensor] | None:
    # before a version is gathered, tensors of the transport's own memory (by published name,
    # in the newest version's dtypes and shapes) the gather casts straight into instead of new
    # ones; `publish` gets them back among its tensors (ipc: its buffer's).

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


TRANSPORTS: Registry[type[WeightTransport]] = Registry(
    "weight transport", "rlkit.weight_transports", TransportParams, form="module:Class"
)


def destination_of(transport: WeightTransport) -> dict[str, torch.Tensor] | None:
    """Where `transport` lets the gather write the next version's tensors (its optional
    `destination`), or None: new tensors, which `publish` copies where they go."""
    destination = getattr(transport, "destination", None)
    return destination() if destination is not None else None


async def load_files(servers: list[ServerAdmin], directory: str, version: int) -> list[Outcome]:
    """Every server in `servers` loads the files in `directory` as `version` (the filesystem
    transport, and the copy the others fall back to)."""
    results = await asyncio.gather(
        *(s.update_weights(directory, version) for s in servers), return_exceptions=True
    )
    return [outcome_of(r) for r in results]


def outcome_of(result: object) -> Outcome:
    """One server's update call as an `Outcome`; anything but an InferenceError re-raises."""
    if isinstance(result, InferenceError):
        return Outcome(False, answered=result.status is not None, error=str(result))
    if isinstance(result, BaseException):
        raise result
    return Outcome(True)
