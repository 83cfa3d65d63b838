"""Process-group setup: the same code runs as one process or under `torchrun`.

Under torchrun the usual env vars (RANK, WORLD_SIZE, MASTER_ADDR, ...) are set; otherwise a
one-rank group is created over an in-memory store, so FSDP2 and DCP always have a group.
Backend: NCCL when CUDA is present, gloo on CPU. Every collective has a timeout, so a lost
rank or node ends the run with an error instead of a hang.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor


def init_distributed(timeout_s: float = 600.0) -> torch.device:
    """Initialise the default process group (once) and return this rank's device."""
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():  # NCCL refuses two ranks on one GPU
            raise RuntimeError(
                f"trainer rank {local_rank} on this node has no GPU of its own: CUDA sees "
                f"{torch.cuda.device_count()}; set trainer.nproc_per_node to at most that"
            )
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if dist.is_initialized():
        return device
    backend = "nccl" if use_cuda else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return device


def shard_mesh(sharding: str, device: torch.device) -> DeviceMesh | None:
    """The mesh FSDP2 shards over: None = every rank (full); hybrid = a 2-D mesh with nodes
    as the replicate dimension and each node's ranks (torchrun's LOCAL_WORLD_SIZE) as shards."""
    if sharding == "full":
        return None
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = world_size()
    if world % per_node:
        raise RuntimeError(f"world size {world} is not a multiple of {per_node} ranks per node")
    return init_device_mesh(
        device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard")
    )


def close_distributed(wait_for_peers: bool = False) -> None:
    """Tear down the process group. `wait_for_peers` (normal exits only: a dead peer would make
    it wait for the collective timeout) first meets every rank at a barrier, so no rank tears
    down gloo while rank 0 still writes weights or a checkpoint; a rank that did so was seen to
    abort ("terminate called without an active exception"), and torchrun then kills rank 0."""
    if dist.is_initialized():
        if wait_for_peers and dist.get_world_size() > 1:
            dist.barrier()
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


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole of `t`: a DTensor gathered from its ranks (a collective), else `t` itself (a
    parameter FSDP2 left out on one rank, see `rlkit.trainer.model._shard`)."""
    return t.full_tensor() if isinstance(t, DTensor) else t
