"""Rollout schedulers: `sync` (the baseline) and `c3po` (Ring-1T Algorithm 1, C3PO++).

A scheduler is any class with the `Scheduler` protocol's methods; `orchestrator.scheduler`
names a registered one (`SCHEDULERS`: the two built-ins), an installed entry point (group
`rlkit.schedulers`) or the user's own class (`"my_pkg.my_module:MyScheduler"`), so adding one is
one file and no edit of rlkit. The two built-ins both pull finished groups (G rollouts of one
prompt) from a `RolloutSource` and hand the trainer one batch per step:

- `SyncScheduler` launches the whole batch, waits for every group, returns it. Inference idles
  while the trainer works and the slowest rollout sets the pace.
- `C3POScheduler` keeps `capacity` rollouts in flight (also while the trainer trains, up to
  one batch ahead). Each finished group goes through the group `processor` (advantages and
  filters) into the training pool and adds its tokens to C;
  the batch is the shortest prefix of the pool with C >= Phi (the token budget). Unfinished
  groups keep running across weight updates (the server pauses, reloads and resumes them);
  after each update, groups whose retention (policy updates spanned) exceeds sigma are purged.

Each group rolls out one prompt handed out by the `PromptStream` at launch, in launch order;
its `uid` is the prompt's draw number (unique in the run, across resumes). A group taken into a
batch settles its prompt as trained, one purged or left without trainable samples as dropped;
once taken into a batch it leaves the pool, so no rollout is trained on twice.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self

from pydantic import BaseModel

from rlkit.envs.rollout import Rollout
from rlkit.orchestrator.prompts import Prompt, PromptStream
from rlkit.protocol.batch import TrainSample
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.orchestrator.config import OrchestratorConfig, RolloutJobConfig


class RolloutSource(Protocol):
    """Produces one scored group: `next_group(prompt)` returns G rollouts of that prompt."""

    group_size: int

    async def next_group(self, prompt: Prompt) -> list[Rollout]: ...


@dataclass
class Group:
    """A finished (or in-flight) group and the bookkeeping the schedulers need."""

    prompt: Prompt
    start_version: int
    rollouts: list[Rollout] = field(default_factory=list)
    samples: list[TrainSample] = field(default_factory=list)  # after the group processor
    tokens: int = 0  # tokens counted against the budget

    @property
    def uid(self) -> int:
        return self.prompt.draw

    @property
    def env_id(self) -> str:
        return self.prompt.env_id

    @property
    def index(self) -> int:
        """Example index in the environment's dataset."""
        return self.prompt.index


def rollout_tokens(rollout: Rollout) -> int:
    """Model-generated tokens of a rollout (what the budget Phi counts)."""
    return sum(len(t.completion_token_ids) for t in rollout.turns)


def rollout_versions(rollout: Rollout) -> list[int]:
    """Every policy version that produced a turn of this rollout."""
    out: list[int] = []
    for turn in rollout.turns:
        out += [v for v in (turn.policy_version_start, turn.policy_version_end) if v is not None]
    return out


def oldest_version(rollout: Rollout, default: int) -> int:
    versions = rollout_versions(rollout)
    return min(versions) if versions else default


@dataclass
class Counters:
    """What the schedulers did since the last `take_counters()`; reported per step."""

    launched: int = 0  # rollouts launched
    finished: int = 0  # rollouts finished
    purged: int = 0  # rollouts purged for retention > sigma
    stale: int = 0  # rollouts dropped for max_off_policy_steps
    failed_groups: int = 0  # groups whose source raised (server gone for good, bug)


ProcessGroup = Callable[[Group], None]
"""Fills `group.samples` and `group.tokens` from `group.rollouts` (advantages, filters);
implemented by `rlkit.orchestrator.batching.GroupProcessor`."""


class Scheduler(Protocol):
    """What the orchestrator's loop asks of a scheduler (`rlkit.orchestrator.loop`).

    `from_config` builds it for a run from the config (the built-ins read their knobs from
    `[orchestrator]`); `groups_per_batch` tells the no-signal watchdog how many groups one batch
    takes. Per step the loop awaits `next_batch()` (a non-empty list of processed groups, their
    prompts settled with the `PromptStream`), calls `on_policy_update(step)` once the servers
    serve the new weights, and logs `take_counters()` and `take_idle_s()`; `close()` cancels
    whatever is still in flight. `version` is the policy version the servers serve.
    """

    version: int

    @classmethod
    def from_config(
        cls,
        cfg: RolloutJobConfig,
        source: RolloutSource,
        processor: ProcessGroup,
        prompts: PromptStream,
        version: int,
    ) -> Scheduler: ...

    @staticmethod
    def groups_per_batch(o: OrchestratorConfig, max_tokens: int) -> int: ...

    async def next_batch(self) -> list[Group]: ...

    def on_policy_update(self, version: int) -> None: ...

    def take_counters(self) -> Counters: ...

    def take_idle_s(self) -> float: ...

    async def close(self) -> None: ...


SCHEDULERS: Registry[type[Scheduler]] = Registry(
    "scheduler", "rlkit.schedulers", BaseModel, form="module:Class"
)
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
    cls = SCHEDULERS.get(name).fn
    missing = [m for m in PROTOCOL_METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(
            f"scheduler {name!r} is not a Scheduler class (rlkit.orchestrator.scheduler."
            f"Scheduler): it lacks {', '.join(missing) or 'a class'}"
        )
    return cls


def _now() -> float:
    """The running event loop's clock (time.monotonic() on asyncio's own loops, the virtual
    clock under `rlkit simulate`); time.monotonic() outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class _SchedulerBase:
    def __init__(
        self,
        source: RolloutSource,
        processor: ProcessGroup,
        *,
        prompts: PromptStream,
        max_off_policy_steps: int,
        version: int = 0,
    ) -> None:
        self.source = source
        self.processor = processor
        self.prompts = prompts
        self.max_off_policy_steps = max_off_policy_steps
        self.version = version  # policy version the servers currently serve
        self.counters = Counters()
        self.error: BaseException | None = None  # a source failure that must stop the run
        self.active = 0  # groups generating right now
        self._idle_since: float | None = _now()
        self._idle_s = 0.0

    @classmethod
    def from_config(
        cls,
        cfg: RolloutJobConfig,
        source: RolloutSource,
        processor: ProcessGroup,
        prompts: PromptStream,
        version: int,
    ) -> Self:
        o = cfg.orchestrator
        return cls(
            source,
            processor,
            prompts=prompts,
            max_off_policy_steps=o.max_off_policy_steps,
            version=version,
            **cls.options(o),
        )

    @staticmethod
    def options(o: OrchestratorConfig) -> dict[str, Any]:
        """This scheduler's own constructor arguments, from `[orchestrator]`."""
        return {}

    def take_counters(self) -> Counters:
        counters, self.counters = self.counters, Counters()
        return counters

    def on_policy_update(self, version: int) -> None:
        self.version = version

    def _drop_stale(self, group: Group) -> None:
        """Remove samples whose oldest turn is more than max_off_policy_steps behind."""
        keep = []
        for sample in group.samples:
            if self.version - sample.policy_version > self.max_off_policy_steps:
                self.counters.stale += 1
                group.tokens -= sum(sample.loss_mask)
            else:
                keep.append(sample)
        group.samples = keep

    def _new_group(self) -> Group:
        return Group(prompt=self.prompts.take(), start_version=self.version)

    def _keep(self, group: Group) -> bool:
        """False (and its prompt dropped) when the group has no trainable sample left."""
        if not group.samples:
            self.prompts.drop(group.prompt, "no_samples")
        return bool(group.samples)

    def _taken(self, batch: list[Group]) -> list[Group]:
        for group in batch:
            self.prompts.trained(group.prompt)
        return batch

    def take_idle_s(self) -> float:
        """Seconds with no rollout in flight since the last call (inference idle time)."""
        now = _now()
        idle = self._idle_s
        if self._idle_since is not None:
            idle += now - self._idle_since
            self._idle_since = now
        self._idle_s = 0.0
        return idle

    async def _run(self, group: Group) -> Group:
        self.active += 1
        if self._idle_since is not None:
            self._idle_s += _now() - self._idle_since
            self._idle_since = None
        try:
            group.rollouts = await self.source.next_group(group.prompt)
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle_since = _now()
        self.counters.finished += len(group.rollouts)
        self.processor(group)
        return group

    async def close(self) -> None:
        """Cancel everything still in flight."""


@SCHEDULERS.register("sync")
class SyncScheduler(_SchedulerBase):
    """Generate the whole batch (`batch_groups` groups), then return it; nothing overlaps."""

    def __init__(
        self, source: RolloutSource, processor: ProcessGroup, *, batch_groups: int, **kw: Any
    ):
        super().__init__(source, processor, **kw)
        self.batch_groups = batch_groups

    @staticmethod
    def options(o: OrchestratorConfig) -> dict[str, Any]:
        return {"batch_groups": o.batch_groups}

    @staticmethod
    def groups_per_batch(o: OrchestratorConfig, max_tokens: int) -> int:
        return o.batch_groups

    async def next_batch(self) -> list[Group]:
        groups = [self._new_group() for _ in range(self.batch_groups)]
        self.counters.launched += self.batch_groups * self.source.group_size
        done = await asyncio.gather(*(self._run(g) for g in groups))
        for group in done:
            self._drop_stale(group)
        return self._taken([g for g in done if self._keep(g)])

    def in_flight(self) -> int:
        return 0


@SCHEDULERS.register("c3po")
class C3POScheduler(_SchedulerBase):
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
        self.tasks: dict[asyncio.Task, Group] = {}
        self._changed = asyncio.Event()

    @staticmethod
    def options(o: OrchestratorConfig) -> dict[str, Any]:
        return {"capacity": o.capacity, "token_budget": o.token_budget, "retention": o.retention}

    @staticmethod
    def groups_per_batch(o: OrchestratorConfig, max_tokens: int) -> int:
        """The groups in flight, or those the budget needs at max_tokens each if that is more."""
        g = o.group_size
        return max(o.capacity // g, math.ceil(o.token_budget / (g * max(max_tokens, 1))), 1)

    def in_flight(self) -> int:
        return len(self.tasks) * self.source.group_size

    def pool_tokens(self) -> int:
        return sum(g.tokens for g in self.pool)

    def fill(self) -> None:
        """Launch groups until Omega rollouts are in flight.

        Generation runs on while the trainer trains, but at most one batch ahead: nothing new
        starts once the finished pool already holds a whole budget of tokens.
        """
        if self.error is not None:
            return
        g = self.source.group_size
        room = max(self.capacity, g)
        while self.in_flight() + g <= room and self.pool_tokens() < self.token_budget:
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
        self.fill()

    async def next_batch(self) -> list[Group]:
        """Wait until the pool holds >= Phi tokens; return that shortest prefix of it."""
        self.fill()
        while True:
            if self.error is not None:
                raise self.error
            total = 0
            for i, group in enumerate(self.pool):
                total += group.tokens
                if total >= self.token_budget:
                    batch, self.pool = self.pool[: i + 1], self.pool[i + 1 :]
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
