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
    "EXIT_MID_UPDATE_ENV",
    "TRANSPORTS",
    "ModelFiles",
    "Outcome",
    "Reception",
    "ServerAdmin",
    "TransportSettings",
    "WeightTransport",
    "transport_class",
]
PROTOCOL_METHODS = ("publish", "published", "settle", "receive", "deliver", "catch_up")


def transport_class(name: str) -> type[WeightTransport]:
    """The transport `name` names ("auto" is filesystem); ValueError when it is unknown or not
    a `WeightTransport`."""
    return TRANSPORTS.get_class(
        "filesystem" if name == "auto" else name, PROTOCOL_METHODS, "rlkit.weights.WeightTransport"
    )
