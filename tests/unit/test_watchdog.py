"""The no-signal watchdog: C3PO++ on groups that never carry signal stops with a reason."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from rlkit.envs import Rollout, Turn
from rlkit.orchestrator.batching import GroupProcessor
from rlkit.orchestrator.config import DifficultyConfig
from rlkit.orchestrator.prompts import Prompt, PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import C3POScheduler
from rlkit.orchestrator.watchdog import NoSignalError, NoSignalWatchdog


class FlatSource:
    """Every group: two rollouts with reward 0 (an untrained model), or every rollout errored."""

    group_size = 2

    def __init__(self, error: str | None = None) -> None:
        self.error = error
        self.groups = 0

    async def next_group(self, prompt: Prompt) -> list[Rollout]:
        await asyncio.sleep(0)
        self.groups += 1
        turn = Turn(
            prompt_token_ids=[1, 2], completion_token_ids=[3, 4], completion_logprobs=[-1.0] * 2
        )
        rollouts = [
            Rollout(env_id="flat", turns=[turn], reward=0.0, error=self.error) for _ in range(2)
        ]
        return rollouts


def run_until_stopped(source: FlatSource) -> tuple[NoSignalError, str]:
    out = io.StringIO()
    watchdog = NoSignalWatchdog(4, 12, Console(file=out, width=300))
    processor = GroupProcessor(
        advantage="grpo", drop_zero_advantage=True, solve_threshold=1.0, watchdog=watchdog
    )
    sampler = PromptSampler({"flat": 10}, {"flat": 1.0}, DifficultyConfig())
    scheduler = C3POScheduler(
        source,
        processor,
        prompts=PromptStream(sampler),
        capacity=4,
        token_budget=8,
        retention=1,
        max_off_policy_steps=1,
    )

    async def main() -> None:
        try:
            await asyncio.wait_for(scheduler.next_batch(), timeout=30)
        finally:
            await scheduler.close()

    with pytest.raises(NoSignalError) as info:
        asyncio.run(main())
    return info.value, out.getvalue()


def test_all_rewards_zero_stops_within_the_limit() -> None:
    source = FlatSource()
    error, log = run_until_stopped(source)
    assert "12 consecutive groups without learning signal" in str(error)  # the first to fire
    assert "flat: all rewards equal within each group (rewards 0 x24)" in str(error)
    assert "stop_groups = 12" in str(error)
    assert "warning:" in log and "4 consecutive groups" in log
    assert source.groups <= 12 + 2  # the groups in flight when it fired, no more


def test_every_rollout_errored_stops_with_the_errors() -> None:
    error, _ = run_until_stopped(FlatSource(error="reward function raised: KeyError 'x'"))
    assert "flat: every rollout errored (" in str(error)
    assert "x reward function raised: reward function raised: KeyError 'x'" in str(error)


def test_a_long_error_is_said_once_and_short() -> None:
    """Issue 66: a ~3 KB message (a template error quoting the whole prompt) is said once per
    cause, with its count, cut to one short line; the full text is in errors.jsonl."""
    long = "reward function 'f' failed: KeyError: " + "x" * 3000
    error, _ = run_until_stopped(FlatSource(error=long))
    text = str(error)
    assert len(text) < 700 and text.count("reward function 'f' raised KeyError") == 1, text
    assert "every message in full: run_dir/errors.jsonl" in text


def test_one_group_with_signal_resets_the_count() -> None:
    watchdog = NoSignalWatchdog(2, 3, Console(file=io.StringIO()))
    for _ in range(2):
        watchdog.observe("e", [0.0, 0.0], [])
    watchdog.observe("e", [0.0, 1.0], [])
    for _ in range(2):
        watchdog.observe("e", [1.0, 1.0], [])
    with pytest.raises(NoSignalError, match="3 consecutive groups.*rewards 1 x6"):
        watchdog.observe("e", [1.0, 1.0], [])
