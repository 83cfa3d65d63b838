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

`weight_transfer = "auto"` is ``filesystem`` (`transport_name`). A LoRA run's adapters are
written as files and loaded by vLLM's adapter loader whatever the transport, so such a run must
name a transport whose class says ``carries_adapters = True`` (only ``filesystem``;
`carries_adapters`). Whatever the transport, the orchestrator owns when
an update happens and checks it afterwards with the logprob canary (`rlkit.inference.canary`).
"""

from __future__ import annotations

from rlkit.weights import broadcast, filesystem, ipc  # noqa: F401  (they register themselves)
from rlkit.weights.transport import (
    EXIT_MID_UPDATE_ENV,
    TRANSPORTS,
    ModelFiles,
    Outcome,
    Reception,
    ServerAdmin,
    TransportSettings,
    WeightTransport,
)

__all__ = [
    "AUTO",
    "EXIT_MID_UPDATE_ENV",
    "TRANSPORTS",
    "ModelFiles",
    "Outcome",
    "Reception",
    "ServerAdmin",
    "TransportSettings",
    "WeightTransport",
    "carries_adapters",
    "transport_class",
    "transport_name",
]
PROTOCOL_METHODS = ("publish", "published", "settle", "receive", "deliver", "catch_up")


AUTO = "auto"  # `[inference] weight_transfer`'s default: the filesystem transport


def transport_name(name: str) -> str:
    """The transport `weight_transfer = name` selects ("auto" is filesystem), as the trainer's
    config names it."""
    return filesystem.Filesystem.name if name == AUTO else name


def transport_class(name: str) -> type[WeightTransport]:
    """The transport `name` names ("auto" is filesystem); ValueError when it is unknown or not
    a `WeightTransport`."""
    return TRANSPORTS.get_class(
        transport_name(name), PROTOCOL_METHODS, "rlkit.weights.WeightTransport"
    )


def carries_adapters(name: str) -> bool:
    """Whether a LoRA run may name the transport `name`: its adapters go as files whatever the
    transport, so only one whose class says so (a class that does not say is taken to move full
    weights only)."""
    return bool(getattr(transport_class(name), "carries_adapters", False))
