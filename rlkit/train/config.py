"""The `rlkit train` configuration: one TOML file for servers, orchestrator and trainer.

Sections: `[model]`, `[[env]]`, `[inference]`, `[orchestrator]` (with `.sampling`,
`.difficulty`, `.eval`), `[trainer]` (the trainer's own model plus `nproc`), `[loss]`,
`[ckpt]`, `[log]`. The sections are defined by the parts that read them
(`rlkit.orchestrator.config`, `rlkit.trainer.config`); this root adds the checks across sections
and `check_environments` the ones pydantic cannot do alone (environments that do not load), so
that a bad config fails before anything is started.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rlkit.orchestrator.config import RolloutJobConfig
from rlkit.orchestrator.source import load_environments
from rlkit.trainer.config import CkptConfig, LossConfig, TrainerConfig
from rlkit.trainer.routing import RoutingReplay


class TrainerSection(TrainerConfig):
    """The trainer's config; `run_dir`, `model`, `loss`, `ckpt`, `max_steps` come from the root."""

    nproc: int = Field(1, ge=1, description="Trainer processes (torchrun --nproc-per-node).")


class TrainConfig(RolloutJobConfig):
    """Root of `rlkit train CONFIG.toml`: the orchestrator's sections plus the trainer's."""

    trainer: TrainerSection = Field(default_factory=TrainerSection, description="Trainer.")
    loss: LossConfig = Field(default_factory=LossConfig, description="Policy loss.")
    ckpt: CkptConfig = Field(default_factory=CkptConfig, description="Checkpoints.")

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        o = self.orchestrator
        if not self.env:
            raise ValueError("env: at least one [[env]] section is required")
        if not self.model.path:
            raise ValueError("model.path: the model to train is required")
        if o.max_tokens <= 0:
            raise ValueError("orchestrator.sampling.max_tokens must be a positive integer")
        if o.token_budget < o.max_tokens:
            raise ValueError(
                f"orchestrator.token_budget ({o.token_budget}) is smaller than one rollout's "
                f"max tokens (orchestrator.sampling.max_tokens = {o.max_tokens})"
            )
        if o.capacity < o.group_size:
            raise ValueError(
                f"orchestrator.capacity ({o.capacity}) must hold at least one group "
                f"(orchestrator.group_size = {o.group_size})"
            )
        if self.ckpt.interval and self.trainer.weights.keep_last <= self.ckpt.interval:
            raise ValueError(
                f"trainer.weights.keep_last ({self.trainer.weights.keep_last}) must exceed "
                f"ckpt.interval ({self.ckpt.interval}) so a resumed run finds its weights"
            )
        for name in ("run_dir", "model", "loss", "ckpt", "max_steps"):
            if name in self.trainer.model_fields_set:
                raise ValueError(f"trainer.{name}: set it in its own section ([{name}]) instead")
        if self.trainer.routing_replay == RoutingReplay.R3:  # R3 replays what servers return
            o.return_routing = True
        return self

    def trainer_config(self) -> TrainerConfig:
        """The config the trainer process reads (`python -m rlkit.trainer.main --config`)."""
        data = self.trainer.model_dump(exclude={"nproc"})
        data.update(
            run_dir=self.log.run_dir,
            max_steps=self.orchestrator.max_steps,
            model=self.model.model_dump(),
            loss=self.loss.model_dump(),
            ckpt=self.ckpt.model_dump(),
        )
        return TrainerConfig.model_validate(data)


def check_environments(config: TrainConfig) -> dict[str, Any]:
    """Load every `[[env]]` up front; an unknown id is a UsageError naming `env.N.id`."""
    config.sandbox.apply()
    return load_environments(config.env)
