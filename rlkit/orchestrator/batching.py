"""From finished groups to trainer samples: errors out, advantages, zero-signal groups dropped.

`GroupProcessor` is the schedulers' `accept` hook. For each finished group it
1. keeps errored rollouts (generation, env or reward failure) out and counts them,
2. feeds the solve rate to the difficulty pools,
3. computes group advantages (GRPO or Dr.GRPO) over the remaining rollouts,
4. drops the group when all rewards are equal (no signal) if asked to,
5. turns each rollout into a `TrainSample` stamped with the oldest policy version that
   produced any of its turns (what staleness and `max_off_policy_steps` are measured from).
It also accumulates the per-step statistics the metrics logger reports.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Group, oldest_version
from rlkit.trainer.advantages import group_advantages
from rlkit.trainer.batch import TrainBatch, TrainSample


@dataclass
class GroupStats:
    """Everything observed about finished groups since the last `take_stats()`."""

    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    solved: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errored: int = 0
    errors: list[str] = field(default_factory=list)  # first few messages, for the log
    zero_advantage_groups: int = 0
    groups: int = 0
    completion_tokens: int = 0  # every finished rollout, trained on or not


class GroupProcessor:
    """The `accept` hook: fills `group.samples` / `group.tokens` and keeps statistics."""

    def __init__(
        self,
        *,
        advantage: str,
        drop_zero_advantage: bool,
        solve_threshold: float,
        sampler: PromptSampler | None = None,
    ) -> None:
        self.advantage = advantage
        self.drop_zero_advantage = drop_zero_advantage
        self.solve_threshold = solve_threshold
        self.sampler = sampler
        self.stats = GroupStats()

    def take_stats(self) -> GroupStats:
        stats, self.stats = self.stats, GroupStats()
        return stats

    def __call__(self, group: Group) -> None:
        stats = self.stats
        stats.groups += 1
        valid: list[tuple[Any, tuple[list[int], list[int], list[float]]]] = []
        for rollout in group.rollouts:
            stats.completion_tokens += sum(len(t.completion_token_ids) for t in rollout.turns)
            error = rollout.error
            sample = None
            if error is None:
                try:
                    sample = rollout.training_sample()
                    if sum(sample[1]) == 0:
                        error = "rollout has no model tokens"
                except ValueError as exc:
                    error = str(exc)
            if error is not None or sample is None:
                stats.errored += 1
                if len(stats.errors) < 5:
                    stats.errors.append(f"{group.env_id}: {error}")
                continue
            valid.append((rollout, sample))
            stats.rewards[group.env_id].append(rollout.reward)
            stats.solved[group.env_id].append(float(rollout.reward >= self.solve_threshold))
        if self.sampler is not None and group.index >= 0:
            self.sampler.observe(group.env_id, group.index, [r.reward for r, _ in valid])
        group.samples, group.tokens = [], 0
        if not valid:
            return
        rewards = [r.reward for r, _ in valid]
        if self.drop_zero_advantage and max(rewards) - min(rewards) <= 1e-8:
            stats.zero_advantage_groups += 1
            return
        advantages = group_advantages(rewards, len(rewards), method=self.advantage)
        for (rollout, (tokens, mask, logprobs)), adv in zip(valid, advantages, strict=True):
            group.samples.append(
                TrainSample(
                    token_ids=tokens,
                    loss_mask=mask,
                    inference_logprobs=logprobs,
                    advantage=adv,
                    policy_version=oldest_version(rollout, group.start_version),
                    env_id=group.env_id,
                    reward=rollout.reward,
                )
            )
            group.tokens += sum(mask)


def make_batch(step: int, groups: list[Group], version: int) -> TrainBatch:
    """One trainer batch from the scheduler's groups (uids recorded so reuse is detectable)."""
    samples = [s for g in groups for s in g.samples]
    staleness = [version - s.policy_version for s in samples]
    return TrainBatch(
        step=step,
        samples=samples,
        meta={
            "group_uids": [g.uid for g in groups],
            "policy_version": version,
            "staleness": staleness,
            "tokens": sum(g.tokens for g in groups),
        },
    )
