"""Asynchronous rollout orchestration: C3PO++ and sync schedulers, batching, metrics."""

from typing import Any

__all__ = ["C3POScheduler", "Orchestrator", "SyncScheduler"]


def __getattr__(name: str) -> Any:
    """The loop and schedulers load on first use: `rlkit.orchestrator.config` (which `rlkit
    train` validates before it starts vLLM) must not pull in torch and transformers."""
    if name == "Orchestrator":
        from rlkit.orchestrator.loop import Orchestrator

        return Orchestrator
    if name in ("C3POScheduler", "SyncScheduler"):
        from rlkit.orchestrator import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
