"""`c3po`: C3PO++ (Ring-1T Algorithm 1). It keeps `capacity` (Omega) rollouts in flight, also
while the trainer trains, up to one batch ahead. Each finished group goes through the group
`processor` (advantages and filters) into the training pool and adds its tokens to C; the batch
is the shortest prefix of the pool with C >= Phi (the token budget). Unfinished groups keep
running across weight updates (the server pauses, reloads and resumes them); after each update,
groups whose retention (policy updates spanned) exceeds sigma are purged."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from pydantic import Field

from rlkit.orchestrator.schedulers.base import (
    SCHEDULERS,
    Group,
    ProcessGroup,
    RolloutSource,
    SchedulerBase,
    SchedulerParams,
    scheduler_table,
)


class C3POParams(SchedulerParams):
    """`[orchestrator.schedulers.c3po]`."""

    capacity: int = Field(64, ge=1, description="Omega: rollouts kept in flight.")
    token_budget: int = Field(8192, gt=0, description="Phi: trainable completion tokens per step.")
    retention: int = Field(
        2, ge=0, description="sigma: purge a rollout that spans more policy updates."
    )


@SCHEDULERS.register("c3po", params=C3POParams)
class C3POScheduler(SchedulerBase):
    """C3PO++: capacity Omega in flight, budget Phi per step, retention threshold sigma."""

    def __init__(
        self,
        source: RolloutSource,
        processor: ProcessGroup,
        *,
        capacity: int,
        token_budget: int,
        retention: int,
        **kw: Any,
    ) -> None:
        super().__init__(source, processor, **kw)
        self.capacity = capacity
        self.token_budget = token_budget
        self.retention = retention
        self.pool: list[Group] = []  # finished groups waiting for a batch, in finish order
        self._pool_tokens = 0  # sum of the pool's `tokens`, kept as the pool changes
        self.tasks: dict[asyncio.Task, Group] = {}
        self._changed = asyncio.Event()

    @staticmethod
    def check_config(o: Any, max_tokens: int | None, where: str) -> None:
        """A rollout of `max_tokens` (`where` says whose) must fit the budget Phi, or it could
        never make a batch; Omega must hold one group."""
        p, table = o.scheduler_settings, scheduler_table(o.scheduler)
        if max_tokens is not None and p.token_budget < max_tokens:
            raise ValueError(
                f"{table}.token_budget ({p.token_budget}) is smaller than one "
                f"rollout's max tokens ({where})"
            )
        if p.capacity < o.group_size:
            raise ValueError(
                f"{table}.capacity ({p.capacity}) must hold at least one group "
                f"(orchestrator.group_size = {o.group_size})"
            )

    @staticmethod
    def groups_per_batch(o: Any, max_tokens: int) -> int:
        """The groups in flight, or those the budget needs at max_tokens each if that is more."""
        g, p = o.group_size, o.scheduler_settings
        return max(p.capacity // g, math.ceil(p.token_budget / (g * max(max_tokens, 1))), 1)

    def in_flight(self) -> int:
        return len(self.tasks) * self.source.group_size

    def pool_tokens(self) -> int:
        """C: the tokens of the finished pool (a running total; `fill` asks on every finish)."""
        return self._pool_tokens

    def fill(self) -> None:
        """Launch groups until Omega rollouts are in flight.

        Generation runs on while the trainer trains, but at most one batch ahead: nothing new
        starts once the finished pool already holds a whole budget of tokens.
        """
        if self.error is not None:
            return
        g = self.source.group_size
        room = max(self.capacity, g)
        if self.pool_tokens() >= self.token_budget:  # the pool does not change in the loop
            return
        while self.in_flight() + g <= room:
            group = self._new_group()
            task = asyncio.create_task(self._run(group))
            self.tasks[task] = group
            self.counters.launched += g
            task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task) -> None:
        group = self.tasks.pop(task, None)
        if group is None or task.cancelled():  # purged by on_policy_update
            return
        if task.exception() is not None:
            self.counters.failed_groups += 1
            self.error = self.error or task.exception()  # the first failure is the cause
        elif self.version - group.start_version > self.retention:
            self.counters.purged += len(group.rollouts)
            self.prompts.drop(group.prompt, "purged")
        else:
            self._drop_stale(group)
            if self._keep(group):
                self.pool.append(group)
                self._pool_tokens += group.tokens
        self._changed.set()
        self.fill()

    def on_policy_update(self, version: int) -> None:
        """New weights are live: purge groups that spanned more than sigma updates."""
        super().on_policy_update(version)
        for task, group in list(self.tasks.items()):
            if version - group.start_version > self.retention:
                task.cancel()
                self.tasks.pop(task)
                self.counters.purged += self.source.group_size
                self.prompts.drop(group.prompt, "purged")
        for group in self.pool:
            self._drop_stale(group)
        self.pool = [g for g in self.pool if self._keep(g)]
        self._pool_tokens = sum(g.tokens for g in self.pool)
        self.fill()

    async def next_batch(self) -> list[Group]:
        """Wait until the pool holds >= Phi tokens; return that shortest prefix of it."""
        self.fill()
        while True:
            if self.error is not None:
                raise self.error
            if self._pool_tokens >= self.token_budget:  # else no prefix reaches Phi either
                total = 0
                for i, group in enumerate(self.pool):
                    total += group.tokens
                    if total >= self.token_budget:
                        batch, self.pool = self.pool[: i + 1], self.pool[i + 1 :]
                        self._pool_tokens -= total
                        self.fill()
                        return self._taken(batch)
            self._changed.clear()
            self.fill()
            await self._changed.wait()

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
