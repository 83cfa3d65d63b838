"""Rollout schedulers: the `Scheduler` protocol, its registry and the built-ins, `sync` (the
baseline, `schedulers/sync.py`) and `c3po` (C3PO++, `schedulers/c3po.py`); the shared parts are
in `schedulers/base.py`. `scheduler_class(name)` is how the orchestrator finds one.
"""

from __future__ import annotations

from typing import Any

from rlkit.orchestrator.schedulers.base import (
    SCHEDULERS,
    Counters,
    Group,
    ProcessGroup,
    RolloutSource,
    Scheduler,
    SchedulerBase,
    SchedulerParams,
    oldest_version,
    rollout_tokens,
    rollout_versions,
)
from rlkit.orchestrator.schedulers.c3po import C3POParams, C3POScheduler
from rlkit.orchestrator.schedulers.sync import SyncParams, SyncScheduler

__all__ = [
    "SCHEDULERS",
    "C3POParams",
    "C3POScheduler",
    "Counters",
    "Group",
    "ProcessGroup",
    "RolloutSource",
    "Scheduler",
    "SchedulerBase",
    "SchedulerParams",
    "SyncParams",
    "SyncScheduler",
    "oldest_version",
    "rollout_tokens",
    "rollout_versions",
    "scheduler_class",
]

PROTOCOL_METHODS = (
    "from_config",
    "groups_per_batch",
    "next_batch",
    "on_policy_update",
    "take_counters",
    "take_idle_s",
    "close",
)


def scheduler_class(name: str) -> type[Scheduler]:
    """The scheduler class `name` names; ValueError when it is unknown or not a `Scheduler`."""
    return SCHEDULERS.get_class(name, PROTOCOL_METHODS, "rlkit.orchestrator.scheduler.Scheduler")


def check_scheduler(o: Any, max_tokens: int | None, where: str) -> None:
    """The chosen scheduler's own checks of the config (its optional `check_config` hook): the
    config's load checks `orchestrator.sampling.max_tokens`, the environments' load each one's."""
    check = getattr(scheduler_class(o.scheduler), "check_config", None)
    if check is not None:
        check(o, max_tokens, where)
