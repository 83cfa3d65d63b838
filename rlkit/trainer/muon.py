"""Muon for FSDP2-sharded weight matrices, with AdamW for the other parameters, as one optimiser.

Muon (Keller Jordan 2024; Moonlight, Liu et al. 2025) steps a hidden weight matrix along the
orthogonalised (Newton-Schulz) Nesterov momentum of its gradient. The orthogonalisation needs
the whole matrix, while FSDP2 leaves each rank a dim-0 shard of it, so each matrix has one owner
rank: every rank updates the momentum of its own shard, the owner gathers the shards,
orthogonalises the full matrix and scatters the result back, and every rank steps its shard.
Owners are dealt largest matrix first to the least-loaded rank, so Newton-Schulz work is
balanced. Shards follow FSDP2's `torch.chunk` split (the last ranks may hold fewer rows or
none): each is padded to the chunk size for the collectives and trimmed afterwards. With HSDP
(replicate x shard mesh) the gather runs within the shard group; replicas compute the same.

The single-matrix math (Newton-Schulz with its quintic coefficients, the shape lr scaling) is
`torch.optim.Muon`'s own, imported from torch, so on one rank the update is exactly
torch.optim.Muon's. Groups with `muon=False` (embeddings, LM head, norms, biases) are stepped by
torch's functional AdamW, so one object serves the LR scheduler and DCP checkpoints: the Muon
momentum is a DTensor shaped like its parameter and is saved and resharded like AdamW's moments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as tdist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim._muon import (  # torch.optim.Muon's single-matrix math
    DEFAULT_A,
    DEFAULT_B,
    DEFAULT_C,
    EPS,
    _adjust_lr,
    _zeropower_via_newtonschulz,
)
from torch.optim.adam import adam

LR_ADJUST = ("match_rms_adamw", "original")


def local(t: Tensor) -> Tensor:
    """This rank's shard of a DTensor (a view: in-place ops update the DTensor), else `t`."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_group(p: Tensor) -> tdist.ProcessGroup | None:
    """The process group `p`'s dim 0 is sharded over (None: `p` is whole on this rank)."""
    if not isinstance(p, DTensor):
        return None
    shards = [i for i, pl in enumerate(p.placements) if pl.is_shard()]
    if len(shards) > 1 or any(not (pl.is_shard(0) or pl.is_replicate()) for pl in p.placements):
        raise ValueError(f"Muon: placements {p.placements} are not FSDP2's dim-0 sharding")
    if not shards or p.device_mesh.size(shards[0]) == 1:
        return None
    return p.device_mesh.get_group(shards[0])


def assign_owners(shapes: list[torch.Size], ranks: int) -> list[int]:
    """Owner rank of each matrix: largest Newton-Schulz cost (m*n*min(m, n)) first, each to the
    least-loaded rank (lowest on ties); the same on every rank."""
    load = [0] * ranks
    owners = [0] * len(shapes)
    cost = [s[0] * s[1] * min(s[0], s[1]) for s in shapes]
    for i in sorted(range(len(shapes)), key=lambda i: -cost[i]):
        owners[i] = min(range(ranks), key=lambda r: load[r])
        load[owners[i]] += cost[i]
    return owners


class Muon(torch.optim.Optimizer):
    """Muon on groups marked `muon=True` (2-D parameters, plain or FSDP2 DTensors), AdamW on
    the rest. Group keys: lr, weight_decay; Muon: momentum, nesterov, ns_steps, adjust_lr_fn;
    AdamW: betas, eps."""

    def __init__(self, groups: Iterable[dict[str, Any]], **defaults: Any) -> None:
        defaults = {
            "momentum": 0.95,
            "nesterov": True,
            "ns_steps": 5,
            "adjust_lr_fn": "match_rms_adamw",
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "weight_decay": 0.0,
            **defaults,
        }
        super().__init__(list(groups), defaults)
        for group in self.param_groups:
            if group["adjust_lr_fn"] not in LR_ADJUST:
                raise ValueError(f"adjust_lr_fn {group['adjust_lr_fn']!r}: one of {LR_ADJUST}")
            bad = [tuple(p.shape) for p in group["params"] if group["muon"] and p.ndim != 2]
            if bad:
                raise ValueError(f"Muon takes 2-D parameters only, got shapes {bad}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (self._muon_step if group["muon"] else self._adamw_step)(group)
        return loss

    def _adamw_step(self, group: dict[str, Any]) -> None:
        """torch.optim.AdamW's update (its functional form), state kept as AdamW keeps it."""
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adam(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            decoupled_weight_decay=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    def _muon_step(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        updates = []
        for p in params:  # momentum of this rank's shard (torch.optim.Muon's formula)
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grad, buf = local(p.grad), local(state["momentum_buffer"])
            buf.lerp_(grad, 1 - group["momentum"])
            updates.append(grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf)
        ortho = self._orthogonalise(params, updates, group["ns_steps"])
        lr, decay = group["lr"], group["weight_decay"]
        for p, update in zip(params, ortho, strict=True):
            shard = local(p)
            shard.mul_(1 - lr * decay)
            shard.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))

    def _orthogonalise(
        self, params: list[Tensor], updates: list[Tensor], steps: int
    ) -> list[Tensor]:
        """Newton-Schulz of each full matrix on its owner; returns this rank's rows of each."""
        coefficients = (DEFAULT_A, DEFAULT_B, DEFAULT_C)

        def newton_schulz(full: Tensor) -> Tensor:
            return _zeropower_via_newtonschulz(full, coefficients, steps, EPS).to(full.dtype)

        groups = [shard_group(p) for p in params]
        sizes = [1 if g is None else tdist.get_world_size(g) for g in groups]
        owners = assign_owners([p.shape for p in params], max(sizes, default=1))
        out = list(updates)
        gathers = []  # (index, owner, work, gathered pieces on the owner)
        for i, (p, group, n) in enumerate(zip(params, groups, sizes, strict=True)):
            if group is None:
                out[i] = newton_schulz(updates[i])
                continue
            owner, padded = owners[i] % n, padded_rows(p, updates[i], tdist.get_rank(group), n)
            pieces = [torch.empty_like(padded) for _ in range(n)]
            pieces = pieces if tdist.get_rank(group) == owner else None
            work = tdist.gather(padded, pieces, group=group, group_dst=owner, async_op=True)
            gathers.append((i, owner, work, pieces))
        scatters = []
        for i, owner, work, pieces in gathers:
            work.wait()
            chunks = None
            if pieces is not None:  # the owner: orthogonalise, split into n padded chunks
                ortho = newton_schulz(torch.cat(pieces)[: params[i].shape[0]])
                chunks = list(pad(ortho, len(pieces) * len(pieces[0])).split(len(pieces[0])))
            rows = math.ceil(params[i].shape[0] / sizes[i])
            mine = updates[i].new_empty(rows, params[i].shape[1])
            work = tdist.scatter(mine, chunks, group=groups[i], group_src=owner, async_op=True)
            scatters.append((i, work, mine))
        for i, work, mine in scatters:
            work.wait()
            out[i] = mine[: updates[i].shape[0]]
        return out


def pad(rows: Tensor, n: int) -> Tensor:
    """`rows` with zero rows appended up to `n` rows (no copy when it has `n` already)."""
    if len(rows) == n:
        return rows.contiguous()
    return torch.cat([rows, rows.new_zeros(n - len(rows), *rows.shape[1:])])


def padded_rows(p: Tensor, shard: Tensor, rank: int, n: int) -> Tensor:
    """This rank's `shard` of `p`'s rows padded to FSDP2's chunk size ceil(rows / n); checks
    that the shard has the rows `torch.chunk` gives rank `rank` (the layout gather assumes)."""
    chunk = math.ceil(p.shape[0] / n)
    expected = max(0, min(chunk, p.shape[0] - rank * chunk))
    if shard.shape[0] != expected:
        raise RuntimeError(
            f"Muon: rank {rank} holds {shard.shape[0]} rows of a {tuple(p.shape)} matrix, "
            f"expected {expected} (FSDP2's torch.chunk split over {n} ranks)"
        )
    return pad(shard, chunk)
