"""What every rollout scheduler shares: the `Scheduler` protocol, its registry, the group
record, the counters, and `SchedulerBase` (the built-ins' common bookkeeping).

A scheduler is any class with the `Scheduler` protocol's methods; `orchestrator.scheduler`
names a registered one (`SCHEDULERS`: `sync`, `c3po`), an installed entry point (group
`rlkit.schedulers`) or the user's own class (`"my_pkg.my_module:MyScheduler"`), so adding one is
one file and no edit of rlkit. Each scheduler owns its parameters: a pydantic model registered
with it (`SCHEDULERS.register(name, params=Model)`), validated when the config loads, from its
own table, keyed by its name as `orchestrator.scheduler` spells it, for built-ins and plugins
alike (`[orchestrator.schedulers.c3po]`, `[orchestrator.schedulers."my_pkg.mod:MyScheduler"]`).

Each group rolls out one prompt handed out by the `PromptStream` at launch, in launch order;
its `uid` is the prompt's draw number (unique in the run, across resumes). A group taken into a
batch settles its prompt as trained, one purged or left without trainable samples as dropped;
once taken into a batch it leaves the pool, so no rollout is trained on twice.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self

from rlkit.config import Config
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.envs.rollout import Rollout
    from rlkit.orchestrator.prompts import Prompt, PromptStream
    from rlkit.protocol.batch import TrainSample


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
    """The oldest version in `rollout_versions`, `default` when none is recorded (a loop: the
    group processor asks once per rollout)."""
    oldest = None
    for turn in rollout.turns:
        for v in (turn.policy_version_start, turn.policy_version_end):
            if v is not None and (oldest is None or v < oldest):
                oldest = v
    return default if oldest is None else oldest


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

    `from_config` builds it for a run from the run's `RolloutJobConfig` (its parameters:
    `cfg.orchestrator.scheduler_settings`, validated against the model it registered);
    `groups_per_batch` tells the no-signal watchdog how many groups one batch takes (`o`: the
    `OrchestratorConfig`); `check_config(o, max_tokens, where)`, where a scheduler has it (the
    hook of `check_scheduler`), refuses a config it cannot run with a ValueError naming the field
    (`max_tokens`: one rollout's largest, None when not known yet; `where` says whose). The
    config is typed `Any` here: it imports this module to validate each scheduler's
    parameters. Per step the loop awaits `next_batch()` (a non-empty list of
    processed groups, their prompts settled with the `PromptStream`), calls
    `on_policy_update(step)` once the servers serve the new weights, and logs `take_counters()`
    and `take_idle_s()`; `close()` cancels whatever is still in flight. `version` is the policy
    version the servers serve.
    """

    version: int

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        source: RolloutSource,
        processor: ProcessGroup,
        prompts: PromptStream,
        version: int,
    ) -> Scheduler: ...

    @staticmethod
    def groups_per_batch(o: Any, max_tokens: int) -> int: ...

    async def next_batch(self) -> list[Group]: ...

    def on_policy_update(self, version: int) -> None: ...

    def take_counters(self) -> Counters: ...

    def take_idle_s(self) -> float: ...

    async def close(self) -> None: ...


def scheduler_table(name: str) -> str:
    """The dotted path of scheduler `name`'s table: ``orchestrator.schedulers.c3po``, its name
    quoted as TOML quotes a key when it is not a bare one (``"my_pkg.mod:MyScheduler"``)."""
    key = name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'
    return f"orchestrator.schedulers.{key}"


class SchedulerParams(Config):
    """A scheduler's own parameters (none by default); a scheduler's model subclasses it."""


SCHEDULERS: Registry[type[Scheduler]] = Registry(
    "scheduler", "rlkit.schedulers", SchedulerParams, form="module:Class"
)


def _now() -> float:
    """The running event loop's clock (time.monotonic() on asyncio's own loops, the virtual
    clock under `rlkit simulate`); time.monotonic() outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class SchedulerBase:
    """Bookkeeping the built-ins share: prompts, staleness, counters, idle time."""

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
        cfg: Any,
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
            **o.scheduler_settings.model_dump(),
        )

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
