"""The orchestrator's sections of the `rlkit train` config: `[[env]]`, `[inference]`,
`[orchestrator]` (with `.sampling`, `.difficulty`, `.eval`) and `[log]`.

`RolloutJobConfig` is the orchestrator's view of a training job (policy, environments,
servers, scheduling, run directory); the whole job's root, `rlkit.launch.config.RLJobConfig`,
extends it with the trainer's sections.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from rlkit.config import Config
from rlkit.envs.sampling import SamplingConfig
from rlkit.orchestrator.sampler import DifficultyConfig
from rlkit.orchestrator.schedulers.base import SCHEDULERS, SchedulerParams, scheduler_table
from rlkit.protocol.credentials import ensure_token_file, read_token
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.model import ModelConfig
from rlkit.sandbox.config import SandboxConfig
from rlkit.weights import moved_transfer_fields, transport_class, transport_params

MOVED_SCHEDULER_FIELDS = {
    "batch_groups": "sync",
    "capacity": "c3po",
    "token_budget": "c3po",
    "retention": "c3po",
}
OLD_SCHEDULER_TABLES = ("sync", "c3po")  # [orchestrator.sync|c3po]: now [orchestrator.schedulers.*]


class EnvSpec(Config):
    id: str = Field(..., min_length=1, description="Environment id: package, folder, OWNER/NAME.")
    weight: float = Field(1.0, gt=0, description="Relative sampling weight among environments.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the env's load_environment()."
    )
    verifiers: str | None = Field(
        None,
        description="Exact verifiers version for a verifiers environment (None: the newest "
        "tested version its declared range allows).",
    )


def check_gpu_list(field: str, gpus: list[int]) -> None:
    """GPU indices are non-negative and each listed once."""
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"{field} = {gpus}: GPU indices must be distinct and >= 0")


class InferenceConfig(Config):
    urls: list[str] = Field(
        default_factory=list, description="Use these running servers instead of launching any."
    )
    token_file: str | None = Field(
        None,
        description="Token file (mode 0600) of the servers in `urls` (their owner's, or this "
        "run's tenant token on a shared `rlkit infer`); None = the run's own, created at "
        "run_dir/token and handed to the servers the run launches.",
    )
    num_servers: int = Field(1, ge=1, description="Servers to launch when `urls` is empty.")
    weights_roots: list[str] = Field(
        default_factory=list,
        description="Directories launched servers may load weights from besides this run's "
        "run_dir/weights (another run directory's, when a server serves another role's run).",
    )
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
        300.0,
        gt=0,
        description="With every server down, wait this long for one to return, then stop the "
        "run with a resumable checkpoint.",
    )
    health_interval_s: float = Field(
        2.0, gt=0, description="How often servers that are down are polled to rejoin the pool."
    )
    restart_dead_servers: bool = Field(
        True, description="Relaunch a launched server whose process died (single-machine mode)."
    )
    busy_loop_s: float | None = Field(
        None,
        ge=0,
        description="Seconds vLLM's worker spins after each message before sleeping "
        "(None = 0.005 on CPU, where it would take cores from the trainer; vLLM's 1 s on GPU).",
    )
    gpus: list[int] = Field(
        default_factory=list,
        description="GPU indices of this machine for the launched servers, split evenly among "
        "them (CUDA_VISIBLE_DEVICES per server); empty = leave the devices alone.",
    )
    weight_transfer: str = Field(
        "auto",
        description="How new weights reach the servers (rlkit.weights): auto (= filesystem) | "
        "filesystem (HF safetensors under run_dir) | broadcast (a gloo/NCCL group from the "
        "trainer to every engine worker) | ipc (a shared-memory buffer: trainer and servers on "
        "one host) | a registered entry point or 'module:Class' of your own.",
    )
    transfer_params: dict[str, Any] = Field(
        default_factory=dict,
        description="The transport's own parameters, validated by the model it registered "
        "(TRANSPORTS.register(name, params=Model)) and passed to the trainer as they are: "
        "broadcast: bucket_mb (most MiB per collective), timeout_s (of every wait of one "
        "update); ipc: timeout_s.",
    )
    canary_max_kl: float = Field(
        0.05,
        gt=0,
        description="Stop the run when a server's canary logprobs after a weight update are "
        "further than this KL (median per-token k3) from the trainer's (metric "
        "weights_canary_kl). Above the engine's bf16 floor, below a wrong update's "
        "(tests/benchmarks/bench_canary.py).",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="vLLM's GPU memory fraction (None = 0.9 on GPUs of its own via `gpus`, "
        "else 0.5, beside the trainer).",
    )

    @field_validator("weight_transfer")
    @classmethod
    def _transfer_known(cls, value: str) -> str:
        transport_class(value)  # a ValueError names what is wrong
        return value

    @model_validator(mode="before")
    @classmethod
    def _moved_transfer_fields(cls, data: Any) -> Any:
        return moved_transfer_fields(data, "weight_transfer", "inference")

    @model_validator(mode="after")
    def _valid_transfer_params(self) -> InferenceConfig:
        transport_params(self.weight_transfer, self.transfer_params, "inference.transfer_params")
        return self

    @model_validator(mode="after")
    def _valid_gpus(self) -> InferenceConfig:
        check_gpu_list("inference.gpus", self.gpus)
        if self.gpus and len(self.gpus) % self.num_servers:
            raise ValueError(
                f"inference.gpus ({len(self.gpus)} GPUs) must split evenly among "
                f"inference.num_servers ({self.num_servers}) servers"
            )
        return self


class OnlineEvalConfig(Config):
    """Evaluation interleaved with training (`[orchestrator.eval]`); `rlkit eval` is EvalConfig."""

    every: int = Field(0, ge=0, description="Evaluate every N steps (0 = only before and after).")
    at_start: bool = Field(True, description="Evaluate before the first step.")
    at_end: bool = Field(True, description="Evaluate after the last step.")
    examples: int = Field(32, ge=1, description="Held-out examples per environment.")
    rollouts_per_example: int = Field(1, ge=1, description="Rollouts per held-out example.")
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(temperature=0.0),
        description="Sampling overrides for evaluation (on top of orchestrator.sampling).",
    )


class WatchdogConfig(Config):
    warn_groups: int = Field(
        0, ge=0, description="Log why after N consecutive groups without signal (0 = 2 batches)."
    )
    stop_groups: int = Field(
        0,
        ge=0,
        description="Stop the run (checkpoint, exit 1) after N such groups (0 = 10 batches).",
    )


class OrchestratorConfig(Config):
    scheduler: str = Field(
        "c3po",
        description="Rollout scheduler: sync (whole batch, then train), c3po (C3PO++ token-budget "
        "pool), an entry point in group rlkit.schedulers, or 'my_pkg.my_module:MyScheduler' "
        "(rlkit.orchestrator.scheduler.Scheduler); its parameters: its table in "
        "[orchestrator.schedulers].",
    )
    max_steps: int = Field(10, ge=1, description="Optimiser steps to run.")
    group_size: int = Field(8, ge=2, description="G: rollouts per prompt (advantage group).")
    schedulers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Each scheduler's parameters, a table per name as orchestrator.scheduler "
        "spells it ([orchestrator.schedulers.c3po], [orchestrator.schedulers.sync], "
        '[orchestrator.schedulers."my_pkg.mod:MyScheduler"]), validated by the model it '
        "registered (SCHEDULERS.register(name, params=Model)); a scheduler without a table "
        "takes its defaults. `rlkit simulate` reads the table of each scheduler it compares.",
    )
    max_off_policy_steps: int = Field(
        4, ge=0, description="Drop samples whose oldest turn is more than N versions old."
    )
    advantage: str = Field(
        "grpo",
        description="Group advantage estimator: grpo | drgrpo, an entry point in group "
        "rlkit.advantages, or 'my_pkg.my_module:function'.",
    )
    advantage_params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the advantage estimator (grpo: eps)."
    )
    drop_zero_advantage: bool = Field(
        True, description="Leave groups whose rewards are all equal out of the batch."
    )
    return_routing: bool = Field(
        False,
        description="MoE: record the engine's routed experts with every completion (R3); "
        "on when trainer.routing_replay = 'r3'.",
    )
    seed: int = Field(0, description="Seed of the prompt sampler.")
    max_overlong_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Drop training prompts longer than the context leaves room for, unless more "
        "than this fraction of an environment's are (then refuse to start).",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig,
        description="Sampling sent with every request, over each environment's sampling_defaults "
        "(unset fields are the environment's; max_tokens must be set by one of them).",
    )
    weights_timeout_s: float = Field(
        3600.0, gt=0, description="How long to wait for the trainer to publish a step's weights."
    )
    difficulty: DifficultyConfig = Field(
        default_factory=DifficultyConfig, description="Online difficulty pools."
    )
    eval: OnlineEvalConfig = Field(
        default_factory=OnlineEvalConfig, description="Interleaved evaluation."
    )
    watchdog: WatchdogConfig = Field(
        default_factory=WatchdogConfig, description="Stop a run whose groups carry no signal."
    )

    _settings: dict[str, SchedulerParams] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _moved_scheduler_fields(cls, data: Any) -> Any:
        """The scheduler knobs that moved into their scheduler's own table; the old tables
        (`[orchestrator.sync]`, `[orchestrator.c3po]`, a plugin's `scheduler_params`, as a
        resumed run's config.toml has them) load into `schedulers`, with a DeprecationWarning."""
        if not isinstance(data, dict):
            return data
        for key in data.keys() & MOVED_SCHEDULER_FIELDS.keys():
            table = scheduler_table(MOVED_SCHEDULER_FIELDS[key])
            raise ValueError(
                f"orchestrator.{key} moved to [{table}] ({table}.{key}): each scheduler owns "
                "its parameters"
            )
        old = [(f"orchestrator.{n}", n, data[n]) for n in OLD_SCHEDULER_TABLES if n in data]
        if data.get("scheduler_params"):  # written for whichever scheduler the config names
            name = str(data.get("scheduler", cls.model_fields["scheduler"].default))
            old.append(("orchestrator.scheduler_params", name, data["scheduler_params"]))
        if not old and "scheduler_params" not in data:
            return data
        gone = (*OLD_SCHEDULER_TABLES, "scheduler_params")  # an empty scheduler_params: silently
        data = {key: value for key, value in data.items() if key not in gone}
        tables = {name: dict(table) for name, table in (data.get("schedulers") or {}).items()}
        for was, name, table in old:
            warnings.warn(f"[{was}] is now [{scheduler_table(name)}]", DeprecationWarning, 2)
            tables[name] = {**table, **tables.get(name, {})}  # the new spelling wins
        data["schedulers"] = tables
        return data

    @model_validator(mode="after")
    def _valid_advantage(self) -> OrchestratorConfig:
        from rlkit.orchestrator.advantages import ADVANTAGES

        ADVANTAGES.get(self.advantage).validate(self.advantage_params, "advantage_params")
        return self

    @model_validator(mode="after")
    def _valid_scheduler(self) -> OrchestratorConfig:
        """The scheduler exists, and every table in `schedulers` (the chosen scheduler's too,
        its defaults when it has none) fits its scheduler's parameter model."""
        from rlkit.orchestrator.scheduler import scheduler_class

        try:
            scheduler_class(self.scheduler)
        except ValueError as exc:  # unknown, unimportable, or not a Scheduler
            raise ValueError(f"orchestrator.scheduler: {exc}") from None
        self._settings = {}
        for name in dict.fromkeys([self.scheduler, *self.schedulers]):
            # the table as validated, defaults filled in (what a dumped config.toml shows)
            self.schedulers[name] = self.params_for(name).model_dump(mode="json")
        return self

    def params_for(self, name: str) -> SchedulerParams:
        """The parameters of the scheduler `name` (as orchestrator.scheduler spells it):
        its table in [orchestrator.schedulers] validated by its model, else its defaults;
        ValueError naming the field when they do not fit."""
        if name not in self._settings:
            where = scheduler_table(name)
            try:
                entry = SCHEDULERS.get(name)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            table = self.schedulers.get(name, {})
            for key in table.keys() - entry.params.model_fields.keys():
                owners = [
                    n for n in SCHEDULERS.names() if key in SCHEDULERS.get(n).params.model_fields
                ]
                if owners:
                    hint = " or ".join(f"{scheduler_table(n)}.{key}" for n in owners)
                    raise ValueError(f"{where}.{key}: unknown field; did you mean {hint}?")
            self._settings[name] = entry.validate(table, where)
        return self._settings[name]

    @property
    def scheduler_settings(self) -> SchedulerParams:
        """The chosen scheduler's validated parameters (what its `from_config` reads)."""
        return self.params_for(self.scheduler)


class LogConfig(Config):
    run_dir: str = Field("runs/train", description="Run directory: batches, weights, metrics.")
    tensorboard: bool = Field(
        False, description="Also write TensorBoard event files to run_dir/tensorboard."
    )
    wandb: bool = Field(False, description="Also log to Weights & Biases.")
    wandb_project: str = Field("rlkit", description="W&B project.")
    wandb_mode: Literal["online", "offline"] = Field(
        "online", description="W&B mode: offline writes the run under run_dir/wandb only."
    )
    mlflow: bool = Field(False, description="Also log to MLflow.")
    mlflow_tracking_uri: str = Field(
        "", description="MLflow tracking URI (empty: SQLite at run_dir/mlflow.db)."
    )
    mlflow_experiment: str = Field("rlkit", description="MLflow experiment name.")
    samples_every: int = Field(
        10, ge=0, description="Log sample rollouts (prompt, completion, reward) every N steps."
    )
    samples_per_step: int = Field(4, ge=1, description="Sample rollouts logged each time.")
    plot: bool = Field(True, description="Draw run_dir/metrics.png during and after the run.")
    plot_every_s: float = Field(
        30.0,
        ge=0,
        description="Redraw the plot at most this often (drawing costs CPU); it is "
        "always drawn after the last step. 0 = after every step.",
    )


class RolloutJobConfig(Config):
    """The sections of `rlkit train`'s config that the orchestrator reads."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy to train.")
    env: list[EnvSpec] = Field(default_factory=list, description="Environments and weights.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Servers.")
    orchestrator: OrchestratorConfig = Field(
        default_factory=OrchestratorConfig, description="Rollout scheduling and batching."
    )
    log: LogConfig = Field(default_factory=LogConfig, description="Run directory and logging.")
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="Sandbox for untrusted code the envs run."
    )


def run_token_file(cfg: RolloutJobConfig) -> Path:
    """The file holding the credential of this run's servers: `inference.token_file`, else the
    run's own (`run_dir/token`)."""
    if cfg.inference.token_file:
        return Path(cfg.inference.token_file)
    return RunLayout(cfg.log.run_dir).token


def run_token(cfg: RolloutJobConfig) -> str:
    """The run's credential: a given `inference.token_file` must exist, the run's own is
    created on first use (every role of the run may be first)."""
    if cfg.inference.token_file:
        return read_token(cfg.inference.token_file)
    return ensure_token_file(run_token_file(cfg))
