"""Trainer configuration models (TOML sections), shared by RL (`rlkit train`) and SFT.

`TrainerConfig` is what `python -m rlkit.trainer.main --config X.toml` reads; the orchestrator's
full `rlkit train` config embeds its sections (`model`, `optim`, `loss`, `ckpt`, ...).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, PrivateAttr, field_validator, model_validator

from rlkit.config import Config
from rlkit.protocol.model import ModelConfig
from rlkit.trainer.allocator import Allocator
from rlkit.trainer.loss import LOSSES, Correction, loss_correction
from rlkit.trainer.optim import OptimConfig
from rlkit.trainer.rl_loss import OldPolicy, ResolvedLoss
from rlkit.trainer.routing import RoutingReplay
from rlkit.weights import TransportParams, moved_transfer_fields, transport_params


class LossConfig(Config):
    """`[loss]`: a registered policy loss, its parameters, the mismatch correction and the old
    policy, resolved once when the config validates (`resolved`, what the trainer calls)."""

    name: str = Field(
        "icepop",
        description="Policy loss: icepop | grpo | tis | cispo | gspo | gppo, an entry point in "
        "group rlkit.losses, or 'my_pkg.my_module:function'.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Parameters of the loss (alpha, beta, eps_low, eps_high, agg, kl_coef, ...), "
        "validated by the loss's own parameter model.",
    )
    mismatch_correction: Correction = Field(
        "icepop",
        description="Weight on pi_old/pi_inf for losses without their own (icepop mask, "
        "truncated IS weight, or none); icepop and tis always use theirs.",
    )
    old_policy: OldPolicy | None = Field(
        None,
        description="The ratio's old policy: recomputed (pi_old, a no-grad pass at step start), "
        "engine (the engine's logprobs) or current (detached pi_theta: r = 1); unset: the "
        "loss's own (current for icepop and tis), else engine.",
    )
    _resolved: ResolvedLoss = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _loss_old_policy(cls, data: Any) -> Any:
        """Fill an unset `old_policy` with the loss's registered one, so the resolved config
        (`--dry-run`) shows the policy every run uses."""
        if isinstance(data, dict) and data.get("old_policy") is None:
            try:
                entry = LOSSES.get(data.get("name", "icepop"))
            except ValueError:
                return data  # the name's own validation reports it
            data = {**data, "old_policy": entry.options.get("old_policy", "engine")}
        return data

    @field_validator("name")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        LOSSES.get(name)  # ValueError: unknown loss, unimportable module
        return name

    @model_validator(mode="after")
    def _resolve(self) -> LossConfig:
        entry = LOSSES.get(self.name)
        params = entry.validate(self.params)  # ValueError naming params.<field>
        fixed = loss_correction(entry, self.mismatch_correction)
        if "mismatch_correction" in self.model_fields_set and fixed != self.mismatch_correction:
            raise ValueError(f"mismatch_correction: loss {self.name!r} always applies {fixed!r}")
        assert self.old_policy is not None  # filled before validation
        self._resolved = ResolvedLoss(entry, params, fixed, self.old_policy)  # type: ignore[arg-type]
        return self

    @property
    def resolved(self) -> ResolvedLoss:
        """The loss the trainer calls (resolved when this config validated)."""
        return self._resolved


class CkptConfig(Config):
    interval: int = Field(0, ge=0, description="Save a checkpoint every N steps (0 = never).")
    keep_last: int = Field(2, ge=1, description="Keep only the newest N checkpoints.")
    resume: str = Field(
        "", description="'latest' to resume from run_dir's latest checkpoint, or a checkpoint dir."
    )


class WeightsConfig(Config):
    publish: bool = Field(True, description="Publish HF safetensors after every RL step.")
    keep_last: int = Field(3, ge=1, description="Keep only the newest N published weight dirs.")
    transfer: str = Field(
        "filesystem",
        description="The weight transport versions reach the servers by (rlkit.weights; set "
        "by `rlkit train` from inference.weight_transfer).",
    )
    transfer_params: dict[str, Any] = Field(
        default_factory=dict,
        description="The transport's own parameters (set by `rlkit train` from "
        "inference.transfer_params, as they are).",
    )

    _transport_params: TransportParams = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _moved_transfer_fields(cls, data: Any) -> Any:
        return moved_transfer_fields(data, "transfer", "trainer.weights")

    @model_validator(mode="after")
    def _valid_transfer_params(self) -> WeightsConfig:
        self._transport_params = transport_params(
            self.transfer, self.transfer_params, "trainer.weights.transfer_params"
        )
        return self

    @property
    def transport_params(self) -> TransportParams:
        """The transport's validated parameters (what its trainer side is built from)."""
        return self._transport_params


class TrainerSettings(Config):
    """How the trainer trains: the fields of `rlkit train`'s `[trainer]` section (which adds how
    to launch it, `rlkit.launch.config.TrainerLaunchConfig`) and of the trainer process's own
    config (`TrainerConfig`, which adds what `rlkit train` takes from the job's other sections)."""

    seed: int = Field(0, description="Seed for torch, python and numpy RNGs.")
    deterministic: bool = Field(
        False, description="torch.use_deterministic_algorithms(True) for bitwise reproducibility."
    )
    micro_batch_tokens: int = Field(
        4096, gt=0, description="Most tokens per packed micro-batch; lower it if memory runs out."
    )
    packing: bool | Literal["auto"] = Field(
        "auto",
        description="Pack several samples per micro-batch row (true), one padded row each "
        "(false), or whichever costs less compute for each batch (auto).",
    )
    allocator: Allocator = Field(
        "auto",
        description="The trainer processes' malloc: tcmalloc, jemalloc (both keep less freed "
        "memory than glibc's: a lower peak per parameter), system (the C library's), or auto "
        "(on CPU tcmalloc, else jemalloc, where installed; else, and on GPU, system). An "
        "allocator already in LD_PRELOAD is kept.",
    )
    logprob_chunk_size: int = Field(
        1024, gt=0, description="Tokens per chunk when computing logprobs from hidden states."
    )
    mini_batches: int = Field(
        1,
        ge=1,
        description="RL: optimiser steps per batch (the batch split into this many mini-batches).",
    )
    batch_timeout_s: float = Field(
        3600.0, gt=0, description="RL: how long to wait for the orchestrator's next batch."
    )
    routing_replay: RoutingReplay = Field(
        RoutingReplay.NONE,
        description="MoE: none = the router's own top-k; r2 = replay the trainer's routing "
        "before the step's first update; r3 = replay the inference engine's routing.",
    )
    router_aux_loss_coef: float = Field(
        0.0, ge=0, description="MoE: weight of the router load-balancing loss (0 = off, as in RL)."
    )
    sharding: Literal["full", "hybrid"] = Field(
        "full",
        description="FSDP2 over all ranks (full), or hybrid (HSDP): shard within a node, "
        "replicate across nodes.",
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Timeout of every collective: a lost rank or node is an error, not a hang.",
    )
    context_parallel: int = Field(
        1,
        ge=1,
        description="Ranks that split each packed row along its length (context parallelism); "
        "it must divide the trainer's world size, which forms a data x context parallel grid.",
    )
    offload_activations: bool = Field(
        False,
        description="Keep the activations saved for backward in (pinned) CPU memory instead of "
        "on the GPU; GPU only.",
    )
    optim: OptimConfig = Field(
        default_factory=OptimConfig, description="Optimiser and LR schedule."
    )
    weights: WeightsConfig = Field(
        default_factory=WeightsConfig, description="Weight publication for inference servers."
    )

    @model_validator(mode="after")
    def _offload_needs_gpu(self) -> TrainerSettings:
        if self.offload_activations and not torch.cuda.is_available():
            raise ValueError(
                "offload_activations = true moves activations from GPU to CPU memory, but no "
                "GPU is visible here; set it to false on CPU"
            )
        return self


class TrainerConfig(TrainerSettings):
    """Everything the FSDP2 trainer process reads for RL (`python -m rlkit.trainer.main`); SFT
    adds its `data` section (see SFTConfig). Under `rlkit train` the fields below come from the
    job's own sections (`RLJobConfig.trainer_config`)."""

    run_dir: str = Field("runs/train", description="Directory for batches, weights, checkpoints.")
    max_steps: int = Field(0, ge=0, description="Stop after this many steps (0 = no limit).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to train.")
    loss: LossConfig = Field(default_factory=LossConfig, description="RL policy loss.")
    ckpt: CkptConfig = Field(default_factory=CkptConfig, description="Checkpointing.")


class SFTDataConfig(Config):
    path: str = Field(
        "",
        description="JSONL file (rows with `messages`, or `prompt` + `completion` message lists) "
        "or an HF dataset name.",
    )
    split: str = Field("train", description="Split to use when `path` is an HF dataset name.")
    max_seq_len: int = Field(2048, gt=0, description="Truncate tokenised conversations to this.")
    epochs: int = Field(1, ge=1, description="Passes over the data (max_steps stops earlier).")
    batch_tokens: int = Field(
        8192, gt=0, description="Tokens per optimiser step (samples are grouped up to this)."
    )
    shuffle: bool = Field(True, description="Shuffle samples each epoch (seeded).")


class SFTConfig(TrainerConfig):
    """`rlkit sft CONFIG.toml`: the trainer plus chat data; writes `run_dir/final`."""

    data: SFTDataConfig = Field(default_factory=SFTDataConfig, description="Chat data.")
    nproc: int = Field(
        1,
        ge=1,
        description="Trainer processes on this machine (torchrun when > 1), as "
        "trainer.nproc_per_node.",
    )

    @model_validator(mode="after")
    def _context_divides_world(self) -> SFTConfig:
        if self.nproc % self.context_parallel:
            raise ValueError(
                f"context_parallel ({self.context_parallel}) must divide nproc ({self.nproc})"
            )
        return self
