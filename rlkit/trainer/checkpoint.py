"""Exact, resumable checkpoints: sharded model + optimiser via torch.distributed.checkpoint.

Layout (`rlkit.protocol.layout`): `checkpoints/step_N/` holds DCP shards of the model and the
optimiser state (AdamW moments, Muon momentum: DTensors sharded like their parameters). Each rank
writes its own shard, so saving scales and a run can resume on another world size; beside them
go `extra_rank{r}.pt` with the scheduler, step, data position and every RNG state, written as
tensors and plain values only and read with `weights_only=True`: a pickle planted in a
checkpoint directory is refused, never run (DCP's own `.metadata` is still a pickle: a
checkpoint directory must be trusted, README "Security").
A checkpoint is written into `.tmp_step_N`, fsynced, renamed, and only then the `latest`
pointer file is replaced atomically, so a crash at any moment leaves the previous checkpoint
usable and never a half-written one.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from rlkit.atomic import atomic_write, replace
from rlkit.errors import UsageError
from rlkit.protocol.layout import RunLayout, step_name
from rlkit.trainer import dist

# Frozen parameters (a LoRA run's base weights) are left out: they never change, and the run
# reloads them from model.path. Without frozen parameters this is the whole model. Loading is
# not strict about the frozen ones only: DCP itself fails on any trainable tensor it lacks.
TRAINABLE = StateDictOptions(ignore_frozen_params=True)
TRAINABLE_LOAD = StateDictOptions(ignore_frozen_params=True, strict=False)


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain values (numpy's key array as an int64 tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Collective: every rank must call it. Returns the final checkpoint directory."""
    layout = RunLayout(run_dir)
    root, final = layout.checkpoints, layout.checkpoint(step)
    tmp = root / f".tmp_{step_name(step)}"
    if dist.is_main():
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINABLE)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    extra = {
        "step": step,
        "scheduler": scheduler.state_dict(),
        "data": data_state,
        "rng": rng_state(),
        "world_size": dist.world_size(),
    }
    torch.save(extra, tmp / f"extra_rank{dist.rank()}.pt")
    dist.barrier()
    if dist.is_main():
        replace(tmp, final)  # fsync the tree, then rename it over any older copy
        atomic_write(layout.latest_checkpoint_pointer, final.name + "\n")
        _prune(layout, keep_last)
    dist.barrier()
    return final


def _prune(layout: RunLayout, keep_last: int) -> None:
    done = layout.checkpoint_dirs()
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(run_dir: str | Path, resume: str) -> Path | None:
    """`latest` -> the pointed-to checkpoint (None when the run has none yet), else a path."""
    if not resume:
        return None
    if resume == "latest":
        path = RunLayout(run_dir).latest_checkpoint()
        if path is None:
            return None
    else:
        path = Path(resume)
    if not (path / ".metadata").is_file():
        raise UsageError(f"checkpoint {path} not found or incomplete (no DCP .metadata)")
    return path


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Collective: restore model, optimiser, scheduler and RNG; returns {step, data}."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINABLE)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=TRAINABLE_LOAD,
    )
    extra_file = path / f"extra_rank{dist.rank()}.pt"
    if not extra_file.is_file():
        extra_file = path / "extra_rank0.pt"  # resumed on more ranks than were saved
    extra = read_extra(extra_file)
    scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"])
    return {"step": extra["step"], "data": extra["data"]}


def read_extra(path: Path) -> dict[str, Any]:
    """A checkpoint's `extra_rank{r}.pt`, read without running any pickled code; anything but
    tensors and plain values (an old checkpoint's numpy arrays, a planted object) is refused."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # torch's UnpicklingError names the global it refused
        raise UsageError(
            f"checkpoint file {path} holds more than tensors and plain values; refused "
            f"unread (a file from an older rlkit or not written by rlkit): {exc}"
        ) from None
