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

- the trainer's exporting rank (an instance, built from `TransportSettings`, whose `params` are
  the transport's own, `[inference.transfer_params]`, validated by the model it registered with
  `TRANSPORTS.register(name, params=Model)` and passed to the trainer as they are): `publish`
  makes the version's tensors reachable inside its directory before it is marked published and
  returns the `PublishedVersion` with its delivery fields; `published` runs after (a broadcast
  starts sending); `settle` waits for the update in flight (before the next one, and at exit).
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

import warnings
from typing import Any

from rlkit.weights import broadcast, filesystem, ipc  # noqa: F401  (they register themselves)
from rlkit.weights.transport import (
    TRANSPORTS,
    ModelFiles,
    Outcome,
    Reception,
    ServerAdmin,
    TransportParams,
    TransportSettings,
    WeightTransport,
)

__all__ = [
    "AUTO",
    "TRANSPORTS",
    "ModelFiles",
    "Outcome",
    "Reception",
    "ServerAdmin",
    "TransportParams",
    "TransportSettings",
    "WeightTransport",
    "carries_adapters",
    "transport_class",
    "transport_name",
    "transport_params",
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


def transport_params(name: str, values: dict[str, Any], where: str) -> TransportParams:
    """`values` as the parameters of the transport `name` names (its registered model); a
    ValueError names each bad field under `where` (e.g. ``inference.transfer_params``)."""
    return TRANSPORTS.get(transport_name(name)).validate(values, where)  # type: ignore[return-value]


MOVED_TRANSFER_FIELDS = {"broadcast_bucket_mb": "bucket_mb", "broadcast_timeout_s": "timeout_s"}


def moved_transfer_fields(data: Any, name_key: str, where: str) -> Any:
    """The transport fields that moved into the transport's own parameters (an old config, or
    a resumed run's config.toml): each goes into `transfer_params` when the transport named by
    `data[name_key]` takes it, else (it was a default written for every run) it is dropped."""
    if not isinstance(data, dict) or not data.keys() & MOVED_TRANSFER_FIELDS.keys():
        return data
    data = dict(data)
    name = transport_name(str(data.get(name_key, AUTO)))
    fields = TRANSPORTS.get(name).params.model_fields
    params = dict(data.get("transfer_params") or {})
    for old, new in MOVED_TRANSFER_FIELDS.items():
        if old in data:
            value = data.pop(old)
            warnings.warn(
                f"{where}.{old} is now {where}.transfer_params.{new}", DeprecationWarning, 2
            )
            if new in fields:
                params.setdefault(new, value)
    data["transfer_params"] = params
    return data
