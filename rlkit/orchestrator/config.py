"""The `rlkit train` configuration: one TOML file for servers, orchestrator and trainer.

Sections: `[model]`, `[[env]]`, `[inference]`, `[orchestrator]` (with `.sampling`,
`.difficulty`, `.eval`), `[trainer]` (the trainer's own model plus `nproc`), `[loss]`,
`[ckpt]`, `[log]`. `check_train_config` adds the checks pydantic cannot do alone (environments
that do not load, a budget smaller than one rollout) so that a bad config fails before anything
is started.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlkit.config import Config
from rlkit.errors import UsageError
from rlkit.trainer.config import CkptConfig, LossConfig, ModelConfig, TrainerConfig


class EnvSpec(Config):
    id: str = Field(..., min_length=1, description="Environment id: package, folder, OWNER/NAME.")
    weight: float = Field(1.0, gt=0, description="Relative sampling weight among environments.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the env's load_environment()."
    )


class InferenceConfig(Config):
    urls: list[str] = Field(
        default_factory=list, description="Use these running servers instead of launching any."
    )
    num_servers: int = Field(1, ge=1, description="Servers to launch when `urls` is empty.")
    host: str = Field("127.0.0.1", description="Address launched servers bind.")
    base_port: int = Field(
        0, ge=0, lt=65536, description="First port for launched servers (0 = any free port)."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Extra vLLM serve arguments for launched servers."
    )
    startup_timeout_s: float = Field(600.0, gt=0, description="Wait this long for a server.")
    request_timeout_s: float = Field(600.0, gt=0, description="Timeout of one HTTP request.")
    max_retries: int = Field(3, ge=0, description="Retries of a failed request (with backoff).")
    recover_timeout_s: float = Field(
        300.0, gt=0, description="How long to wait for a dead server to come back before failing."
    )
    restart_dead_servers: bool = Field(
        True, description="Relaunch a launched server whose process died (single-machine mode)."
    )


class DifficultyConfig(Config):
    enabled: bool = Field(True, description="Track per-example solve rates in easy/normal/hard.")
    easy_fraction: float = Field(0.0, ge=0, le=1, description="Share of draws from easy examples.")
    hard_fraction: float = Field(0.0, ge=0, le=1, description="Share of draws from hard examples.")
    solve_threshold: float = Field(1.0, description="A rollout with reward >= this is solved.")
    easy_threshold: float = Field(1.0, ge=0, le=1, description="Solve rate >= this: easy.")
    hard_threshold: float = Field(0.0, ge=0, le=1, description="Solve rate <= this: hard.")

    @model_validator(mode="after")
    def _fractions(self) -> DifficultyConfig:
        if self.easy_fraction + self.hard_fraction > 1:
            raise ValueError("easy_fraction + hard_fraction must be at most 1")
        return self


class EvalConfig(Config):
    every: int = Field(0, ge=0, description="Evaluate every N steps (0 = only before and after).")
    at_start: bool = Field(True, description="Evaluate before the first step.")
    at_end: bool = Field(True, description="Evaluate after the last step.")
    examples: int = Field(32, ge=1, description="Held-out examples per environment.")
    rollouts_per_example: int = Field(1, ge=1, description="Rollouts per held-out example.")
    sampling: dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 0.0},
        description="Sampling overrides for evaluation (on top of orchestrator.sampling).",
    )


class OrchestratorConfig(Config):
    scheduler: Literal["sync", "c3po"] = Field(
        "c3po", description="sync = whole batch then train; c3po = C3PO++ token-budget pool."
    )
    max_steps: int = Field(10, ge=1, description="Optimiser steps to run.")
    group_size: int = Field(8, ge=2, description="G: rollouts per prompt (advantage group).")
    batch_groups: int = Field(8, ge=1, description="sync: groups per batch.")
    capacity: int = Field(64, ge=1, description="C3PO++ Omega: rollouts kept in flight.")
    token_budget: int = Field(
        8192, gt=0, description="C3PO++ Phi: trainable completion tokens per step."
    )
    retention: int = Field(
        2, ge=0, description="C3PO++ sigma: purge a rollout that spans more policy updates."
    )
    max_off_policy_steps: int = Field(
        4, ge=0, description="Drop samples whose oldest turn is more than N versions old."
    )
    advantage: Literal["grpo", "drgrpo"] = Field("grpo", description="Group advantage method.")
    drop_zero_advantage: bool = Field(
        True, description="Leave groups whose rewards are all equal out of the batch."
    )
    seed: int = Field(0, description="Seed of the prompt sampler.")
    sampling: dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 1.0, "max_tokens": 256},
        description="Sampling parameters sent with every request (max_tokens required).",
    )
    weights_timeout_s: float = Field(
        3600.0, gt=0, description="How long to wait for the trainer to publish a step's weights."
    )
    difficulty: DifficultyConfig = Field(
        default_factory=DifficultyConfig, description="Online difficulty pools."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Interleaved evaluation.")

    @property
    def max_tokens(self) -> int:
        return int(self.sampling.get("max_tokens") or 0)


class TrainerSection(TrainerConfig):
    """The trainer's config; `run_dir`, `model`, `loss`, `ckpt`, `max_steps` come from the root."""

    nproc: int = Field(1, ge=1, description="Trainer processes (torchrun --nproc-per-node).")


class LogConfig(Config):
    run_dir: str = Field("runs/train", description="Run directory: batches, weights, metrics.")
    wandb: bool = Field(False, description="Also log to Weights & Biases (when installed).")
    wandb_project: str = Field("rlkit", description="W&B project.")
    plot: bool = Field(True, description="Rewrite run_dir/metrics.png after every step.")


class TrainConfig(Config):
    """Root of `rlkit train CONFIG.toml`."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy to train.")
    env: list[EnvSpec] = Field(default_factory=list, description="Environments and weights.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Servers.")
    orchestrator: OrchestratorConfig = Field(
        default_factory=OrchestratorConfig, description="Rollout scheduling and batching."
    )
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="Trainer.")
    loss: LossConfig = Field(default_factory=LossConfig, description="Policy loss.")
    ckpt: CkptConfig = Field(default_factory=CkptConfig, description="Checkpoints.")
    log: LogConfig = Field(default_factory=LogConfig, description="Run directory and logging.")

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
    """Load every environment up front; an unknown id is a UsageError naming `env.N.id`."""
    from rlkit.envs import load_environment

    envs: dict[str, Any] = {}
    for i, spec in enumerate(config.env):
        if spec.id in envs:
            raise UsageError(f"env.{i}.id: environment {spec.id!r} is listed twice")
        try:
            envs[spec.id] = load_environment(spec.id, **spec.args)
        except UsageError as exc:
            raise UsageError(f"env.{i}.id: {exc}") from exc
        except TypeError as exc:
            raise UsageError(f"env.{i}.args: {exc}") from exc
        if envs[spec.id].dataset is None:  # never train on an evaluation set by accident
            raise UsageError(
                f"env.{i}.args: environment {spec.id!r} has no training set with these "
                "arguments (only evaluation rows); point it at training data"
            )
    return envs
