"""`[slurm]`: the cluster job of `rlkit train --slurm` (rendered by `rlkit.launch.slurm`)."""

from __future__ import annotations

import datetime

from pydantic import Field, field_validator

from rlkit.config import Config


class SlurmConfig(Config):
    """`[slurm]`: the cluster job `rlkit train --slurm` renders and submits."""

    job_name: str = Field("rlkit", description="sbatch --job-name.")
    trainer_nodes: int = Field(1, ge=1, description="Nodes running the trainer (torchrun nnodes).")
    inference_nodes: int = Field(1, ge=1, description="Nodes running vLLM inference servers.")
    partition: str | None = Field(None, description="sbatch --partition (None = the default).")
    account: str | None = Field(None, description="sbatch --account (None = the default).")
    time: str = Field("24:00:00", description="sbatch --time limit of the whole run.")
    gres: str | None = Field(None, description="Generic resources per node, e.g. 'gpu:8'.")
    cpus_per_node: int | None = Field(
        None, ge=1, description="CPUs each role gets on its node (srun --cpus-per-task)."
    )
    exclusive: bool = Field(True, description="Whole nodes for the job (sbatch --exclusive).")
    workdir: str | None = Field(
        None,
        description="Directory every node starts in, for relative paths in the config "
        "(None = where `rlkit train --slurm` ran); must be on the shared filesystem.",
    )
    venv: str | None = Field(None, description="Virtualenv activated on every node.")
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before the roles start (module load, conda activate...).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables exported to every role."
    )
    container_image: str | None = Field(
        None, description="Run each role in this container (pyxis: srun --container-image)."
    )
    container_mounts: list[str] = Field(
        default_factory=list, description="pyxis --container-mounts, e.g. '/shared:/shared'."
    )
    rdzv_port: int = Field(29500, gt=0, lt=65536, description="Trainer rendezvous port.")
    sbatch_args: list[str] = Field(
        default_factory=list, description="Extra sbatch options, e.g. '--qos=high'."
    )

    @field_validator("time", mode="before")
    @classmethod
    def _time_as_text(cls, value: object) -> object:
        """`--slurm.time=00:30:00` parses as a TOML time; sbatch wants the text back."""
        return value.strftime("%H:%M:%S") if isinstance(value, datetime.time) else value
