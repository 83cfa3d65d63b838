"""`sync`: the baseline scheduler. It launches the whole batch, waits for every group and
returns it; inference idles while the trainer works and the slowest rollout sets the pace."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from rlkit.orchestrator.schedulers.base import (
    SCHEDULERS,
    Group,
    ProcessGroup,
    RolloutSource,
    SchedulerBase,
    SchedulerParams,
)


class SyncParams(SchedulerParams):
    """`[orchestrator.schedulers.sync]`."""

    batch_groups: int = Field(8, ge=1, description="Groups per batch.")


@SCHEDULERS.register("sync", params=SyncParams)
class SyncScheduler(SchedulerBase):
    """Generate the whole batch (`batch_groups` groups), then return it; nothing overlaps."""

    def __init__(
        self, source: RolloutSource, processor: ProcessGroup, *, batch_groups: int, **kw: Any
    ):
        super().__init__(source, processor, **kw)
        self.batch_groups = batch_groups

    @staticmethod
    def groups_per_batch(o: Any, max_tokens: int) -> int:
        return o.scheduler_settings.batch_groups

    async def next_batch(self) -> list[Group]:
        groups = [self._new_group() for _ in range(self.batch_groups)]
        self.counters.launched += self.batch_groups * self.source.group_size
        done = await asyncio.gather(*(self._run(g) for g in groups))
        for group in done:
            self._drop_stale(group)
        return self._taken([g for g in done if self._keep(g)])

    def in_flight(self) -> int:
        return 0
