"""`rlkit train`: the whole RL job, its config (`rlkit.launch.config.RLJobConfig`) and the
launcher of servers, orchestrator and trainer (`rlkit.launch.launcher.run_train`)."""

from typing import Any

from rlkit.launch.roles import Role

__all__ = ["Role", "RLJobConfig", "run_train"]


def __getattr__(name: str) -> Any:
    """`RLJobConfig` and `run_train` load on first use, so `rlkit --help` never imports torch."""
    if name == "RLJobConfig":
        from rlkit.launch.config import RLJobConfig

        return RLJobConfig
    if name == "run_train":
        from rlkit.launch.launcher import run_train

        return run_train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
