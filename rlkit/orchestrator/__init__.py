"""Asynchronous rollout orchestration: C3PO++ and sync schedulers, batching, metrics."""

from rlkit.orchestrator.config import TrainConfig
from rlkit.orchestrator.loop import run_orchestrator
from rlkit.orchestrator.scheduler import C3POScheduler, SyncScheduler

__all__ = ["C3POScheduler", "SyncScheduler", "TrainConfig", "run_orchestrator"]
