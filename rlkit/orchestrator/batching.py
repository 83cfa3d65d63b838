"""From finished groups to trainer samples: errors out, advantages, zero-signal groups dropped.

`GroupProcessor` is the schedulers' group processor (`scheduler.ProcessGroup`). For each
finished group it
1. keeps errored rollouts (generation, env or reward failure) out and counts them,
2. feeds the solve rate to the difficulty pools,
3. computes group advantages (GRPO or Dr.GRPO) over the remaining rollouts,
4. drops the group when all rewards are equal (no signal) if asked to,
5. turns each rollout into a `TrainSample` stamped with the oldest policy version that
   produced any of its turns (what staleness and `max_off_policy_steps` are measured from)
   and the temperature its turns record (the trainer divides logits by it).
It also accumulates the per-step statistics the metrics logger reports, among them the
high-reward (solved) rollouts that an environment's exploit detectors flag
(`Exploit.detect`, `rlkit env audit`): a reward the policy is learning to game shows there.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rlkit.envs.exploits import Exploit
from rlkit.envs.rollout import Rollout, TrainingTokens
from rlkit.orchestrator.advantages import GroupEstimator
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Group, oldest_version
from rlkit.orchestrator.watchdog import NoSignalWatchdog
from rlkit.protocol.batch import TrainBatch, TrainSample
from rlkit.protocol.routing import encode_routing
from rlkit.runs.rollout_errors import error_record


@dataclass
class GroupStats:
    """Everything observed about finished groups since the last `take_stats()`."""

    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    solved: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    task_rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errored: int = 0
    errors: list[str] = field(default_factory=list)  # first few messages, for the log
    # every errored rollout (`rlkit.runs.rollout_errors.error_record`), for errors.jsonl
    error_records: list[dict[str, Any]] = field(default_factory=list)
    zero_advantage_groups: int = 0
    groups: int = 0
    # completion tokens of every finished rollout, trained on or not
    completion_lengths: list[int] = field(default_factory=list)
    # "{env_id}/{reward function}" -> its scores over the scored rollouts (`Rollout.metrics`)
    reward_functions: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rollouts: int = 0  # every finished rollout, trained on or not
    turns: int = 0  # model turns over those rollouts
    exact_continuations: int = 0  # rollouts whose turns extend each other token for token
    token_prompts: int = 0  # rollouts sent as token-id prompts (token in, token out)
    context_ended: int = 0  # rollouts ended because the next prompt would not fit
    # "{env_id}/{exploit}" -> solved rollouts that exploit's detector flagged
    flagged: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class GroupProcessor:
    """The schedulers' group processor: fills `group.samples` / `group.tokens`, keeps stats."""

    def __init__(
        self,
        *,
        advantage: str,
        advantage_params: dict[str, Any] | None = None,
        drop_zero_advantage: bool,
        solve_threshold: float,
        sampler: PromptSampler | None = None,
        watchdog: NoSignalWatchdog | None = None,
        detectors: dict[str, list[Exploit]] | None = None,
    ) -> None:
        self.estimator = GroupEstimator(advantage, advantage_params)  # validated once, here
        self.drop_zero_advantage = drop_zero_advantage
        self.solve_threshold = solve_threshold
        self.sampler = sampler
        self.watchdog = watchdog
        # env id -> its exploits that can recognise themselves in a real rollout
        self.detectors = {
            env_id: [e for e in exploits if e.detect is not None]
            for env_id, exploits in (detectors or {}).items()
        }
        self.stats = GroupStats()

    def flag(self, env_id: str, rollout: Rollout) -> None:
        """Count the exploits whose detector recognises this solved rollout; a raising detector
        counts under `{exploit}!error` (it must not stop training, nor hide)."""
        for exploit in self.detectors.get(env_id, []):
            assert exploit.detect is not None
            try:
                hit = exploit.detect(rollout)
            except Exception:
                self.stats.flagged[f"{env_id}/{exploit.name}!error"] += 1
                continue
            if hit:
                self.stats.flagged[f"{env_id}/{exploit.name}"] += 1

    def take_stats(self) -> GroupStats:
        stats, self.stats = self.stats, GroupStats()
        return stats

    def __call__(self, group: Group) -> None:
        stats = self.stats
        stats.groups += 1
        stats.rollouts += len(group.rollouts)
        env_id = group.env_id
        valid: list[tuple[Rollout, TrainingTokens, int]] = []  # with its trained tokens
        errors: list[str] = []
        for rollout in group.rollouts:
            turns = rollout.turns
            stats.completion_lengths.append(sum([len(t.completion_token_ids) for t in turns]))
            stats.turns += len(turns)
            stats.exact_continuations += rollout.exact_continuation
            stats.token_prompts += rollout.prompt_mode == "tokens"
            stats.context_ended += rollout.finish_reason == "context"
            error = rollout.error
            sample = None
            if error is None:
                try:
                    sample = rollout.training_sample()
                    trained = sum(sample.loss_mask)
                    if trained == 0:
                        error = "rollout has no model tokens"
                except ValueError as exc:
                    error = str(exc)
            if error is not None or sample is None:
                stats.errored += 1
                errors.append(str(error))
                stats.error_records.append(
                    error_record(
                        env_id=env_id, example_id=rollout.example_id, error=error, phase="train"
                    )
                )
                if len(stats.errors) < 5:
                    stats.errors.append(f"{env_id}: {error}")
                continue
            valid.append((rollout, sample, trained))
            stats.rewards[env_id].append(rollout.reward)
            solved = rollout.reward >= self.solve_threshold
            stats.solved[env_id].append(float(solved))
            if solved:
                self.flag(env_id, rollout)
            for name, value in rollout.metrics.items():
                stats.reward_functions[f"{env_id}/{name}"].append(value)
            if rollout.info.get("task") is not None:  # environments with named tasks (logic)
                stats.task_rewards[f"{env_id}/{rollout.info['task']}"].append(rollout.reward)
        if self.sampler is not None and group.index >= 0:
            self.sampler.observe(env_id, group.index, [r.reward for r, _, _ in valid])
        group.samples, group.tokens = [], 0
        if self.watchdog is not None:  # may raise NoSignalError, which stops the run
            self.watchdog.observe(env_id, [r.reward for r, _, _ in valid], errors)
        if not valid:
            return
        rewards = [r.reward for r, _, _ in valid]
        if self.drop_zero_advantage and max(rewards) - min(rewards) <= 1e-8:
            stats.zero_advantage_groups += 1
            return
        advantages = self.estimator(rewards)
        for (rollout, sample, trained), adv in zip(valid, advantages, strict=True):
            group.samples.append(
                TrainSample(
                    token_ids=sample.token_ids,
                    loss_mask=sample.loss_mask,
                    inference_logprobs=sample.inference_logprobs,
                    advantage=adv,
                    policy_version=oldest_version(rollout, group.start_version),
                    env_id=env_id,
                    example_id=rollout.example_id,
                    reward=rollout.reward,
                    temperature=sample.temperature,
                    **routing_fields(sample),
                )
            )
            group.tokens += trained


def routing_fields(sample: TrainingTokens) -> dict[str, Any]:
    """The engine's routing (R3) of a sample as `TrainSample` fields; none when not recorded."""
    if sample.routing is None:
        return {}
    return {"routing": encode_routing(sample.routing), "routing_dims": sample.routing.shape[1:]}


def make_batch(
    step: int, groups: list[Group], version: int, dropped: list[dict[str, Any]] | None = None
) -> TrainBatch:
    """One trainer batch from the scheduler's groups.

    Its meta records each group's uid (so reuse is detectable) and prompt (draw, env, row,
    example id, epoch, samples), and the prompts dropped since the previous batch
    (`PromptStream.take_dropped`): the ledger `rlkit runs audit` checks.
    """
    samples = [s for g in groups for s in g.samples]
    staleness = [version - s.policy_version for s in samples]
    return TrainBatch(
        step=step,
        samples=samples,
        meta={
            "group_uids": [g.uid for g in groups],
            "prompts": [prompt_record(g) for g in groups],
            "dropped": dropped or [],
            "policy_version": version,
            "staleness": staleness,
            "tokens": sum(g.tokens for g in groups),
        },
    )


def prompt_record(group: Group) -> dict[str, Any]:
    """What a batch records of a trained group's prompt."""
    return {
        **group.prompt.record(),
        "example_id": group.samples[0].example_id if group.samples else None,
        "samples": len(group.samples),
    }
