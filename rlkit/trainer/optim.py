"""The optimiser (a registry: adamw, muon) and the LR schedule: linear warm-up, then constant or
cosine decay. Only parameters with requires_grad are handed to the optimiser."""

from __future__ import annotations

import math
from collections.abc import Callable
from fnmatch import fnmatch
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel
from torch import nn

from rlkit.registry import Registry
from rlkit.trainer.muon import Muon

if TYPE_CHECKING:  # config.py validates optim.name against OPTIMIZERS
    from rlkit.trainer.config import OptimConfig

# builder(model, cfg) -> the optimiser over the model's trainable parameters
OptimizerBuilder = Callable[[nn.Module, "OptimConfig"], torch.optim.Optimizer]
OPTIMIZERS: Registry[OptimizerBuilder] = Registry("optimizer", "rlkit.optimizers", BaseModel)


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Multiplier of the peak lr at optimiser step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant" or total_steps <= cfg.warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / (total_steps - cfg.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


@OPTIMIZERS.register("adamw")
def adamw(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """torch.optim.AdamW over every trainable parameter."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )


def muon_split(model: nn.Module, keep_adamw: list[str]) -> tuple[list, list]:
    """(Muon, AdamW) trainable parameters: Muon takes each 2-D matrix whose name matches no
    `keep_adamw` pattern; AdamW the rest (embeddings, LM head, norms, biases, 3-D experts)."""
    muon, other = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            matrix = p.ndim == 2 and not any(fnmatch(name, pat) for pat in keep_adamw)
            (muon if matrix else other).append(p)
    return muon, other


@OPTIMIZERS.register("muon")
def muon(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """Muon (rlkit.trainer.muon, sharded over FSDP2) on hidden matrices, AdamW on the rest."""
    matrices, other = muon_split(model, cfg.muon.adamw_params)
    groups = [
        {"params": other, "muon": False, "lr": cfg.lr},
        {"params": matrices, "muon": True, "lr": cfg.muon.lr or cfg.lr},
    ]
    return Muon(
        [g for g in groups if g["params"]],
        weight_decay=cfg.weight_decay,
        betas=cfg.betas,
        eps=cfg.eps,
        momentum=cfg.muon.momentum,
        nesterov=cfg.muon.nesterov,
        ns_steps=cfg.muon.ns_steps,
        adjust_lr_fn=cfg.muon.adjust_lr,
    )


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """`cfg.name`'s optimiser and the LR schedule (every group's lr times `lr_factor`);
    `total_steps` only matters for cosine."""
    optimizer = OPTIMIZERS.get(cfg.name).fn(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, total_steps)
    )
    return optimizer, scheduler
