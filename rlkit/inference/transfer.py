"""How new weights travel from the trainer to the engines: `[inference] weight_transfer`.

- ``filesystem``: the trainer writes HF safetensors with their fingerprint and the canary's
  logprobs under `run_dir/weights/step_N`; each server's workers read them, check them against
  the fingerprint and load them in place (``POST /rlkit/update_weights``). Also the checkpoint
  format, and what a server that rejoins the pool loads.
- ``auto``: ``filesystem`` (the only transport this build has).
- ``broadcast`` (a process group between the trainer and every engine worker) and ``ipc``
  (CUDA IPC handles, trainer and engine on one GPU) are refused at validation: not built yet.

Whatever the transport, the orchestrator owns when an update happens (pause in keep mode, load,
bump the version, resume) and checks it afterwards with the logprob canary
(`rlkit.inference.canary`).
"""

from __future__ import annotations

from typing import Literal

WeightTransfer = Literal["auto", "filesystem", "broadcast", "ipc"]

NOT_BUILT = {
    "broadcast": "a process group between the trainer and every engine worker (not built in "
    "this version)",
    "ipc": "trainer and engine on one CUDA GPU (CUDA IPC handles; not built in this version)",
}


def check_weight_transfer(choice: str) -> str:
    """`choice` if this build can move weights that way, else ValueError saying why not."""
    if choice in NOT_BUILT:
        raise ValueError(
            f"weight_transfer = {choice!r} needs {NOT_BUILT[choice]}; use 'filesystem' (or 'auto')"
        )
    return choice
