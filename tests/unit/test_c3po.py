"""C3PO++ and sync scheduler tests against a fake rollout source with controlled lengths
(tests/helpers/fake_engine.py)."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from rlkit.envs import Rollout
from rlkit.orchestrator.config import DifficultyConfig
from rlkit.orchestrator.prompts import Prompt, PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import C3POScheduler, SyncScheduler, rollout_tokens
from tests.helpers.fake_engine import FakeEngine, processor


def stream() -> PromptStream:
    """A prompt stream over one fake environment of 1,000 rows."""
    return PromptStream(PromptSampler({"fake": 1000}, {"fake": 1.0}, DifficultyConfig()))


def c3po(engine: FakeEngine, *, capacity=8, budget=100, retention=1, max_off=10) -> C3POScheduler:
    return C3POScheduler(
        engine,
        processor(),
        prompts=stream(),
        capacity=capacity,
        token_budget=budget,
        retention=retention,
        max_off_policy_steps=max_off,
    )


async def test_trainer_steps_exactly_when_budget_reached() -> None:
    rng = random.Random(0)
    engine = FakeEngine((rng.randint(5, 60) for _ in itertools.count()), group_size=2)
    sched = c3po(engine, capacity=8, budget=150)
    try:
        for step in range(6):
            batch = await sched.next_batch()
            tokens = [g.tokens for g in batch]
            assert sum(tokens) >= 150, "stepped before C reached Phi"
            assert sum(tokens[:-1]) < 150, "waited past the group that made C >= Phi"
            assert all(g.tokens == sum(sum(s.loss_mask) for s in g.samples) for g in batch)
            engine.version = step + 1
            sched.on_policy_update(step + 1)
    finally:
        await sched.close()


async def test_no_rollout_trained_twice_and_pool_stays_full() -> None:
    rng = random.Random(1)
    engine = FakeEngine(int(rng.paretovariate(1.2) * 5) for _ in itertools.count())
    sched = c3po(engine, capacity=8, budget=80, retention=3)
    seen_groups: set[int] = set()
    seen_rollouts: set[int] = set()
    try:
        for step in range(8):
            batch = await sched.next_batch()
            assert sched.in_flight() <= 8
            for group in batch:
                assert group.uid not in seen_groups
                seen_groups.add(group.uid)
                for rollout in group.rollouts:
                    assert rollout.example_id not in seen_rollouts
                    seen_rollouts.add(rollout.example_id)
            engine.version = step + 1
            sched.on_policy_update(step + 1)
    finally:
        await sched.close()
    assert len(seen_groups) >= 8


async def test_rollouts_purged_when_retention_exceeds_sigma() -> None:
    engine = FakeEngine(itertools.repeat(10_000), group_size=2, token_s=1e-3)  # never finish
    sched = c3po(engine, capacity=4, budget=100, retention=1)
    try:
        sched.fill()
        await asyncio.sleep(0.01)
        assert sched.in_flight() == 4
        engine.version = 1
        sched.on_policy_update(1)  # spanned 1 update: sigma = 1 keeps them
        assert sched.counters.purged == 0
        engine.version = 2
        sched.on_policy_update(2)  # spanned 2 > sigma: purged, and the pool refilled
        assert sched.counters.purged == 4
        assert sched.in_flight() == 4
        assert all(g.start_version == 2 for g in sched.tasks.values())
    finally:
        await sched.close()


async def test_in_flight_rollouts_continue_and_record_versions_per_turn() -> None:
    engine = FakeEngine(itertools.repeat(20), group_size=2, turns=3)
    engine.gate = asyncio.Event()
    sched = c3po(engine, capacity=2, budget=100, retention=5)
    try:
        task = asyncio.create_task(sched.next_batch())
        while engine.at_gate < 2:  # both rollouts finished turn 1 under version 0
            await asyncio.sleep(0.001)
        engine.version = 1
        sched.on_policy_update(1)
        engine.gate.set()
        batch = await task
    finally:
        await sched.close()
    rollouts = batch[0].rollouts
    versions = [[(t.policy_version_start, t.policy_version_end) for t in r.turns] for r in rollouts]
    for turns in versions:
        assert turns[0] == (0, 0) and turns[-1] == (1, 1), versions
    assert all(r.policy_versions == [0, 1] for r in rollouts)
    assert all(s.policy_version == 0 for s in batch[0].samples)  # oldest turn counts


async def test_max_off_policy_drops_stale_samples() -> None:
    engine = FakeEngine(itertools.repeat(30), group_size=2, token_s=1e-3)
    sched = c3po(engine, capacity=2, budget=50, retention=10, max_off=0)
    try:
        task = asyncio.create_task(sched.next_batch())
        await asyncio.sleep(0.01)
        engine.version = 1
        sched.on_policy_update(1)  # the in-flight group started at 0: stale on arrival
        batch = await task
    finally:
        await sched.close()
    assert sched.counters.stale == 2
    assert all(s.policy_version == 1 for g in batch for s in g.samples)


async def test_errored_rollouts_kept_out_and_counted() -> None:
    class Erroring(FakeEngine):
        async def rollout(self, length: int) -> Rollout:
            r = await super().rollout(length)
            if r.example_id % 4 == 0:
                r.error = "reward function raised ValueError"
            return r

    engine = Erroring(itertools.repeat(10), group_size=4)
    proc = processor()
    sched = SyncScheduler(engine, proc, prompts=stream(), batch_groups=3, max_off_policy_steps=1)
    batch = await sched.next_batch()
    stats = proc.take_stats()
    assert stats.errored == 3
    assert sum(len(g.samples) for g in batch) == 9
    assert sched.counters.launched == 12


async def test_sync_scheduler_returns_whole_batch() -> None:
    engine = FakeEngine(itertools.cycle([5, 50, 9]), group_size=2)
    sched = SyncScheduler(
        engine, processor(), prompts=stream(), batch_groups=4, max_off_policy_steps=1
    )
    batch = await sched.next_batch()
    assert len(batch) + 0 <= 4 and sched.counters.finished == 8
    assert all(rollout_tokens(r) in (5, 50, 9) for g in batch for r in g.rollouts)


async def test_source_failure_stops_c3po() -> None:
    class Broken(FakeEngine):
        async def next_group(self, prompt: Prompt):
            raise RuntimeError("inference servers not healthy after 5s")

    sched = c3po(Broken(itertools.repeat(1)))
    with pytest.raises(RuntimeError, match="not healthy"):
        await sched.next_batch()
    await sched.close()
