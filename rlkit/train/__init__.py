"""`rlkit train`: one command that runs inference servers, orchestrator and trainer together."""

from rlkit.train.launcher import run_train

__all__ = ["run_train"]
