"""The optimiser (a registry: adamw, muon) and the LR schedule: linear warm-up, then constant or
cosine decay. Only parameters with requires_grad are handed to the optimiser."""

from __future__ import annotations

import math
from collections.abc import Callable
from fnmatch import fnmatch
from typing import Literal

import torch
from pydantic import BaseModel, Field, field_validator
from torch import nn

from rlkit.config import Config
from rlkit.registry import Registry

# builder(model, cfg) -> the optimiser over the model's trainable parameters
OptimizerBuilder = Callable[[nn.Module, "OptimConfig"], torch.optim.Optimizer]
OPTIMIZERS: Registry[OptimizerBuilder] = Registry("optimizer", "rlkit.optimizers", BaseModel)


class MuonConfig(Config):
    """`[optim.muon]`: Muon's settings, used when optim.name = "muon"."""

    lr: float = Field(
        0.0,
        ge=0,
        description="Peak lr of the Muon matrices; 0 = optim.lr (suits adjust_lr = "
        "'match_rms_adamw', which makes Muon's update RMS match AdamW's).",
    )
    momentum: float = Field(0.95, ge=0, lt=1, description="Momentum of the gradient average.")
    nesterov: bool = Field(True, description="Orthogonalise the Nesterov look-ahead momentum.")
    ns_steps: int = Field(5, ge=1, le=99, description="Newton-Schulz iterations per matrix.")
    adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw",
        description="Lr scaling by shape [A, B]: match_rms_adamw = 0.2*sqrt(max(A, B)) "
        "(Moonlight; reuses AdamW's lr and weight decay), original = sqrt(max(1, A/B)) "
        "(Keller Jordan; wants a lr near 0.02).",
    )
    adamw_params: list[str] = Field(
        ["*embed_tokens*", "*lm_head*"],
        description="fnmatch patterns of 2-D parameter names left to AdamW; parameters that are "
        "not 2-D (norms, biases, MoE experts) are AdamW's anyway.",
    )


class OptimConfig(Config):
    name: str = Field(
        "adamw",
        description="Optimiser: adamw, or muon (Muon on hidden matrices, AdamW on the rest), "
        "an entry point in group rlkit.optimizers, or 'my_pkg.my_module:builder'.",
    )
    lr: float = Field(
        1e-5, gt=0, description="Peak learning rate (AdamW; Muon too unless muon.lr)."
    )
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (AdamW and Muon).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW beta1, beta2.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps from 0 to the peak lr.")
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="LR after warm-up: constant, or cosine decay to min_lr_ratio."
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    muon: MuonConfig = Field(default_factory=MuonConfig, description="Muon, when name = 'muon'.")

    @field_validator("name")
    @classmethod
    def _known_optimizer(cls, name: str) -> str:
        OPTIMIZERS.get(name)  # ValueError: unknown optimiser, unimportable module
        return name


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
    """torch.optim.AdamW over every trainable parameter, fused on CPU and CUDA: the per-tensor
    form allocates two temporaries the size of each parameter (the 151,936-token embedding:
    1.2 GB at Qwen3-0.6B, 2 bytes per parameter at the trainer's peak); the fused one none."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=all(p.device.type in ("cpu", "cuda") for p in params) or None,
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
    from rlkit.trainer.muon import Muon  # torch.optim._muon: only in recent torch releases

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
