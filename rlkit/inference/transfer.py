"""How new weights travel from the trainer to the engines: `[inference] weight_transfer`.

- ``filesystem``: the trainer writes HF safetensors with their fingerprint and the canary's
  logprobs under `run_dir/weights/step_N`; each server's workers read them, check them against
  the fingerprint and load them in place (``POST /rlkit/update_weights``). Also the checkpoint
  format, and what a server that rejoins the pool loads.
- ``broadcast``: the trainer publishes only a manifest (names, shapes, buckets, its store's
  address) with the fingerprint and canary, and sends the tensors in bounded buckets over a
  process group it opens per update with every engine worker (`rlkit.inference.broadcast`:
  gloo on CPU, NCCL on CUDA, a timeout on every collective, a dead peer named). Each server
  joins through ``POST /rlkit/receive_weights``, verifies against the fingerprint and loads.
  Checkpoint steps are still published as files, and a live server that missed an update
  loads the filesystem copy of the same version that the trainer then writes.
- ``auto``: ``filesystem`` (broadcast only when chosen).
- ``ipc`` (CUDA IPC handles, trainer and engine on one GPU) is refused at validation: it needs
  a GPU to build and test.

Whatever the transport, the orchestrator owns when an update happens (pause in keep mode, load,
bump the version, resume) and checks it afterwards with the logprob canary
(`rlkit.inference.canary`).
"""

from __future__ import annotations

from typing import Literal

WeightTransfer = Literal["auto", "filesystem", "broadcast", "ipc"]

NOT_BUILT = {
    "ipc": "trainer and engine on one CUDA GPU (CUDA IPC handles; not built in this version, "
    "it needs a GPU to build and test)",
}


def check_weight_transfer(choice: str) -> str:
    """`choice` if this build can move weights that way, else ValueError saying why not."""
    if choice in NOT_BUILT:
        raise ValueError(
            f"weight_transfer = {choice!r} needs {NOT_BUILT[choice]}; use 'filesystem', "
            "'broadcast' or 'auto'"
        )
    return choice
