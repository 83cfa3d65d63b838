"""Asynchronous rollout orchestration: C3PO++ and sync schedulers, batching, metrics."""

from rlkit.deprecated import moved_names
from rlkit.orchestrator.loop import run_orchestrator
from rlkit.orchestrator.scheduler import C3POScheduler, SyncScheduler

__all__ = ["C3POScheduler", "SyncScheduler", "run_orchestrator"]

__getattr__ = moved_names(__name__, {"TrainConfig": "rlkit.train.config:TrainConfig"})
