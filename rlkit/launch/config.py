"""The `rlkit train` configuration: one TOML file for servers, orchestrator and trainer.

Sections: `[model]`, `[[env]]`, `[inference]`, `[orchestrator]` (with `.sampling`,
`.difficulty`, `.eval`), `[trainer]` (the trainer plus its launch: nodes, processes per node,
rendezvous), `[loss]`, `[ckpt]`, `[log]`, `[slurm]` (the cluster job of `--slurm`). The sections
are defined by the parts that read them (`rlkit.orchestrator.config`, `rlkit.trainer.config`,
`rlkit.launch.slurm_config`); this root adds the checks across sections and `check_environments`
the ones pydantic cannot do alone (environments that do not load), so that a bad config fails
before anything is started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from rich.console import Console

from rlkit.config import dump_toml
from rlkit.envs.fit import fit_training_sets, max_model_len, renderer_for, served_context
from rlkit.envs.rendering import load_tokenizer
from rlkit.errors import UsageError
from rlkit.launch.roles import Role
from rlkit.launch.slurm_config import SlurmConfig
from rlkit.orchestrator.config import RolloutJobConfig, check_gpu_list, run_token_file
from rlkit.orchestrator.loggers import check_sinks
from rlkit.orchestrator.scheduler import check_scheduler
from rlkit.orchestrator.source import close_environments, load_environments, max_rollout_tokens
from rlkit.progress import make_console, phase, print_line
from rlkit.protocol.credentials import read_token
from rlkit.sandbox.preflight import check_sandbox_service
from rlkit.sim.config import SimConfig
from rlkit.trainer.config import CkptConfig, LossConfig, TrainerConfig, TrainerSettings
from rlkit.trainer.context_parallel import describe_mesh
from rlkit.trainer.routing import RoutingReplay
from rlkit.weights import AUTO, carries_adapters, transport_name

LAUNCH_FIELDS = {"nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "gpus"}


class TrainerLaunchConfig(TrainerSettings):
    """`[trainer]` of `rlkit train`: how the trainer trains (`TrainerSettings`) plus how to launch
    it (nodes, processes per node, rendezvous, GPUs); the trainer process's `run_dir`, `model`,
    `loss`, `ckpt` and `max_steps` come from the job's own sections (`RLJobConfig.trainer_config`).

    The launch fields are read by the launcher only (the torchrun command line, see
    `rlkit.trainer.main.trainer_command`); every node of a multi-node trainer runs
    `rlkit train CONFIG --role trainer --trainer.node_rank R` with the same other fields.
    """

    nproc_per_node: int = Field(
        1, ge=1, description="Trainer processes on each node (torchrun --nproc-per-node)."
    )
    nnodes: int = Field(1, ge=1, description="Trainer nodes (torchrun --nnodes).")
    node_rank: int = Field(
        0, ge=0, description="This node's index; node 0 hosts the c10d rendezvous store."
    )
    rdzv_endpoint: str = Field(
        "",
        description="HOST:PORT of the c10d rendezvous (node 0's address), needed when nnodes > 1.",
    )

    gpus: list[int] = Field(
        default_factory=list,
        description="GPU indices of this node for the trainer's ranks (CUDA_VISIBLE_DEVICES), "
        "one per process; empty = leave the devices alone.",
    )

    @model_validator(mode="after")
    def _valid_launch(self) -> TrainerLaunchConfig:
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"trainer.node_rank ({self.node_rank}) must be below trainer.nnodes ({self.nnodes})"
            )
        if self.nnodes > 1:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"trainer.rdzv_endpoint must be HOST:PORT when trainer.nnodes > 1 "
                    f"(got {self.rdzv_endpoint!r}): node 0's address and a free port"
                )
        check_gpu_list("trainer.gpus", self.gpus)
        if self.gpus and len(self.gpus) != self.nproc_per_node:
            raise ValueError(
                f"trainer.gpus lists {len(self.gpus)} GPU(s) but trainer.nproc_per_node is "
                f"{self.nproc_per_node}: one GPU per trainer process"
            )
        world = self.nproc_per_node * self.nnodes
        if world % self.context_parallel:
            raise ValueError(
                f"trainer.context_parallel ({self.context_parallel}) must divide the trainer's "
                f"world size, trainer.nproc_per_node x trainer.nnodes = {world}"
            )
        if self.sharding == "hybrid" and self.nnodes == 1:
            raise ValueError(
                "trainer.sharding = 'hybrid' replicates across nodes: it needs trainer.nnodes > 1"
            )
        return self


class RLJobConfig(RolloutJobConfig):
    """Root of `rlkit train CONFIG.toml`: the orchestrator's sections plus the trainer's."""

    trainer: TrainerLaunchConfig = Field(
        default_factory=TrainerLaunchConfig, description="Trainer."
    )
    loss: LossConfig = Field(default_factory=LossConfig, description="Policy loss.")
    ckpt: CkptConfig = Field(default_factory=CkptConfig, description="Checkpoints.")
    slurm: SlurmConfig = Field(
        default_factory=SlurmConfig, description="Cluster job for `rlkit train --slurm`."
    )
    simulate: SimConfig = Field(
        default_factory=SimConfig, description="Simulated cluster of `rlkit simulate`."
    )

    @model_validator(mode="after")
    def _consistent(self) -> RLJobConfig:
        o = self.orchestrator
        if not self.env:
            raise ValueError("env: at least one [[env]] section is required")
        if not self.model.path:
            raise ValueError("model.path: the model to train is required")
        max_tokens = o.sampling.max_tokens  # an environment's own is checked when it loads
        check_scheduler(o, max_tokens, f"orchestrator.sampling.max_tokens = {max_tokens}")
        if self.ckpt.interval and self.trainer.weights.keep_last <= self.ckpt.interval:
            raise ValueError(
                f"trainer.weights.keep_last ({self.trainer.weights.keep_last}) must exceed "
                f"ckpt.interval ({self.ckpt.interval}) so a resumed run finds its weights"
            )
        transfer = self.inference.weight_transfer
        if self.model.lora.enabled and not carries_adapters(transfer):
            raise ValueError(
                f"inference.weight_transfer = {transfer!r} moves full weights; a LoRA run's "
                f"adapters are loaded by vLLM from files: use {transport_name(AUTO)!r} (or "
                f"{AUTO!r})"
            )
        if self.trainer.routing_replay == RoutingReplay.R3:  # R3 replays what servers return
            o.return_routing = True
        return self

    def to_toml(self) -> str:
        """The resolved config as TOML that loads back."""
        return dump_toml(self)

    def trainer_config(self) -> TrainerConfig:
        """The config the trainer process reads (`python -m rlkit.trainer.main --config`); the
        loss is this config's, already resolved."""
        data = self.trainer.model_dump(exclude=LAUNCH_FIELDS)
        i = self.inference
        data["weights"].update(
            transfer=transport_name(i.weight_transfer), transfer_params=i.transfer_params
        )
        data.update(
            run_dir=self.log.run_dir,
            max_steps=self.orchestrator.max_steps,
            model=self.model.model_dump(),
            loss=self.loss,
            ckpt=self.ckpt.model_dump(),
        )
        return TrainerConfig.model_validate(data)


def check_environments(config: RLJobConfig) -> dict[str, Any]:
    """Load every `[[env]]` up front (an unknown id is a UsageError naming `env.N.id`) and drop
    the training prompts that do not fit the context, or refuse when too many do not."""
    config.sandbox.apply()
    check_chat_template(config.model.path)
    envs = load_environments(config.env)
    try:
        check_sandbox_service(envs.items())  # what they ask the sandbox service for
        max_rollout_tokens(envs, config.orchestrator)
        fit_prompts(config, envs, make_console(stderr=True))
    except BaseException:
        close_environments(envs)
        raise
    return envs


def check_chat_template(model_path: str) -> None:
    """Refuse, before any server starts, a local model whose tokenizer has no chat template:
    every environment sends chat messages, so every rollout would error at its first turn."""
    if not (Path(model_path) / "tokenizer_config.json").is_file():
        return  # a hub name, or a folder that check_model_dir judges
    try:
        tokenizer = load_tokenizer(model_path)
    except Exception:
        return  # an unreadable tokenizer: the server's start says why
    if tokenizer.chat_template is None:
        raise UsageError(
            f"model.path {model_path}: its tokenizer has no chat template, and environments "
            "send chat messages (every rollout would error). Use the model's chat/instruct "
            f"variant, or give it a template: put the family's template in {model_path}/"
            "chat_template.jinja (or tokenizer_config.json's chat_template)"
        )


def fit_prompts(config: RLJobConfig, envs: dict[str, Any], console: Console) -> None:
    """`rlkit.envs.fit.fit_training_sets` with the servers' context (asked from running servers in
    `inference.urls`, else the launch flags or the model's) and the model's chat template."""
    urls, model = config.inference.urls, config.model.path
    token_file = run_token_file(config)  # read, not created: nothing is written while checking
    token = read_token(token_file) if token_file.exists() else None
    context = (urls and served_context(urls, model, token)) or max_model_len(
        config.inference.extra_args, model
    )
    renderer = renderer_for(config.model.path)
    if context is None or renderer is None:
        print_line(
            console,
            f"prompt lengths not checked: no local tokenizer or context length for "
            f"{config.model.path}",
        )
        return
    rows = sum(len(env.get_dataset()) for env in envs.values())
    with phase(console, f"tokenising {rows} training prompts to check they fit {context} tokens"):
        fit_training_sets(
            envs,
            renderer,
            context,
            config.orchestrator.sampling,
            config.orchestrator.max_overlong_fraction,
            lambda message: print_line(console, message),
        )


def check_role(config: RLJobConfig, role: Role | str) -> dict[str, Any]:
    """Validate and load what `role` needs before anything starts: the environments (and their
    prompts' fit) for the roles that run the orchestrator; a trainer or inference node never
    reads them (their datasets may not even be reachable from it)."""
    t = config.trainer
    if Role(role).runs_trainer and t.context_parallel > 1:  # what the trainer's ranks form
        print_line(
            make_console(stderr=True),
            describe_mesh(t.nproc_per_node * t.nnodes, t.context_parallel),
        )
    if Role(role).runs_orchestrator:
        check_sinks(config.log)
        return check_environments(config)
    return {}
