"""AdamW and the learning-rate schedule: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math

import torch
from torch import nn

from rlkit.trainer.config import OptimConfig


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Multiplier of the peak lr at optimiser step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant" or total_steps <= cfg.warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / (total_steps - cfg.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over all trainable parameters; `total_steps` only matters for cosine."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, total_steps)
    )
    return optimizer, scheduler
