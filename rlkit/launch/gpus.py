"""GPUs per role: `[inference] gpus` and `[trainer] gpus` place vLLM and the trainer on disjoint
devices of one machine, through each child's CUDA_VISIBLE_DEVICES.

Indices count the GPUs this process may use (CUDA_VISIBLE_DEVICES when it is set, else every
GPU), so `rlkit train` under a scheduler that already restricted the devices still works.
Everything is checked before any process starts; an empty list leaves the devices alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlkit.errors import UsageError
from rlkit.launch.roles import Role

if TYPE_CHECKING:
    from rlkit.launch.config import RLJobConfig

VISIBLE = "CUDA_VISIBLE_DEVICES"
DEDICATED_MEMORY_FRACTION = 0.9  # vLLM alone on its GPUs
SHARED_MEMORY_FRACTION = 0.5  # vLLM beside the trainer on the same GPUs


def machine_gpus() -> list[str]:
    """The device ids this process may hand out, in index order."""
    visible = os.environ.get(VISIBLE)
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def select(field: str, indices: list[int], available: list[str]) -> str:
    """CUDA_VISIBLE_DEVICES for `indices` of `available`; a UsageError naming `field` else."""
    if not available:
        raise UsageError(f"{field} = {indices}: this machine has no GPU (CUDA sees none)")
    missing = [i for i in indices if i >= len(available)]
    if missing:
        raise UsageError(
            f"{field} = {indices}: GPU {missing[0]} does not exist; this machine has "
            f"{len(available)} GPU(s), indices 0..{len(available) - 1}"
        )
    return ",".join(available[i] for i in indices)


def server_devices(gpus: list[int], num_servers: int, available: list[str]) -> list[str | None]:
    """Each launched server's CUDA_VISIBLE_DEVICES: `gpus` split into equal consecutive slices
    (the config checks that they divide), or None for every server when `gpus` is empty."""
    if not gpus:
        return [None] * num_servers
    select("inference.gpus", gpus, available)
    per = len(gpus) // num_servers
    return [
        select("inference.gpus", gpus[i * per : (i + 1) * per], available)
        for i in range(num_servers)
    ]


def check_disjoint(inference: list[int], trainer: list[int]) -> None:
    """Both roles on this machine: they must not share a GPU."""
    shared = sorted(set(inference) & set(trainer))
    if shared:
        raise UsageError(
            f"inference.gpus and trainer.gpus share GPU(s) {shared}: give each role its own"
        )


def memory_fraction(configured: float | None, dedicated: bool) -> float:
    """vLLM's --gpu-memory-utilization: the configured value, else most of a GPU of its own
    and half of one it shares with the trainer."""
    if configured is not None:
        return configured
    return DEDICATED_MEMORY_FRACTION if dedicated else SHARED_MEMORY_FRACTION


@dataclass(frozen=True)
class GpuPlan:
    """CUDA_VISIBLE_DEVICES of each launched server and of this node's trainer (None: as is)."""

    servers: list[str | None]
    trainer: str | None


def plan_gpus(cfg: RLJobConfig, role: Role | str) -> GpuPlan:
    """The devices of the roles this process launches, checked against this machine."""
    inf, trainer = cfg.inference, cfg.trainer
    runs_servers = Role(role).launches_servers(inf.urls)
    runs_trainer = Role(role).runs_trainer
    wanted = (runs_servers and inf.gpus) or (runs_trainer and trainer.gpus)
    available = machine_gpus() if wanted else []
    if runs_servers and runs_trainer:
        check_disjoint(inf.gpus, trainer.gpus)
    servers = server_devices(inf.gpus, inf.num_servers, available) if runs_servers else []
    devices = (
        select("trainer.gpus", trainer.gpus, available) if runs_trainer and trainer.gpus else None
    )
    return GpuPlan(servers=servers, trainer=devices)
