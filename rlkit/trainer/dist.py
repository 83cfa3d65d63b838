"""Process-group setup: the same code runs as one process or under `torchrun`.

Under torchrun the usual env vars (RANK, WORLD_SIZE, MASTER_ADDR, ...) are set; otherwise a
one-rank group is created over an in-memory store, so FSDP2 and DCP always have a group.
Backend: NCCL when CUDA is present, gloo on CPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed() -> torch.device:
    """Initialise the default process group (once) and return this rank's device."""
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if dist.is_initialized():
        return device
    backend = "nccl" if use_cuda else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)
    else:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum a few floats across ranks (float64 on CPU with gloo, on device with NCCL)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
