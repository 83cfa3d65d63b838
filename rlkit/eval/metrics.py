"""Eval metrics: the unbiased pass@k estimator and the summary of a run.

pass@k follows Chen et al. (2021, "Evaluating Large Language Models Trained on Code"): with n
samples of which c succeed, pass@k = 1 - C(n-c, k) / C(n, k), computed as a running product so
large n does not overflow. avg@k is the mean reward over the k rollouts of each example, averaged
over examples (equal to the mean reward when every example has k rollouts).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlkit.envs.rollout import Rollout
from rlkit.runs.rollout_errors import cause_counts


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def k_values(k: int) -> list[int]:
    """The k reported for pass@k: powers of two below k, plus k itself."""
    return sorted({2**i for i in range(k.bit_length()) if 2**i < k} | {k})


def _success(rollout: Rollout, threshold: float, metric: str | None) -> bool:
    if rollout.error is not None:
        return False
    score = rollout.reward if metric is None else rollout.metrics.get(metric, 0.0)
    return score >= threshold


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


# Row `info` fields that split the reward in summaries (e.g. logic's task and level).
INFO_GROUPS = ("task", "level")


def reward_by_info(rollouts: Sequence[Rollout]) -> dict[str, dict[str, float]]:
    """Mean reward (errored rollouts count 0) per value of each `INFO_GROUPS` field present."""
    by: dict[str, dict[str, list[float]]] = {}
    for rollout in rollouts:
        for field in INFO_GROUPS:
            value = rollout.info.get(field)
            if value is not None:
                reward = 0.0 if rollout.error else rollout.reward
                by.setdefault(field, defaultdict(list))[str(value)].append(reward)
    return {
        field: {value: float(np.mean(rewards)) for value, rewards in sorted(groups.items())}
        for field, groups in by.items()
    }


def summarize(
    rollouts: Sequence[Rollout],
    k: int,
    threshold: float = 1.0,
    metric: str | None = None,
) -> dict[str, Any]:
    """Summary of an eval: rewards, avg@k, pass@k, metric means, reward per task (and other
    `INFO_GROUPS` fields of the rows' info), errors, tokens, latency.

    Rollouts are grouped per example by (env_id, example_id); errored rollouts count as reward 0
    and as failures (they are also counted under `errors`). `k` is the number of rollouts per
    example; pass@j is reported for j in `k_values(k)` over the examples that have at least j
    rollouts. Success is `reward >= threshold`, or `metrics[metric] >= threshold`. `prompt_modes`
    counts how the rollouts' turns were sent: `tokens` (token in, token out) or `messages`.
    """
    groups: dict[tuple[str, Any], list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        groups[(rollout.env_id, rollout.example_id)].append(rollout)

    rewards = [0.0 if r.error else r.reward for r in rollouts]
    metric_values: dict[str, list[float]] = defaultdict(list)
    for rollout in rollouts:
        if rollout.error is None:
            for name, value in rollout.metrics.items():
                metric_values[name].append(value)

    pass_k: dict[str, float] = {}
    for j in k_values(k):
        scores = [
            pass_at_k(len(g), sum(_success(r, threshold, metric) for r in g), j)
            for g in groups.values()
            if len(g) >= j
        ]
        if scores:
            pass_k[f"pass@{j}"] = float(np.mean(scores))

    group_means = [
        float(np.mean([0.0 if r.error else r.reward for r in g])) for g in groups.values()
    ]
    generation = [r.timings["generation_s"] for r in rollouts if "generation_s" in r.timings]
    errors = [r for r in rollouts if r.error is not None]
    return {
        "num_rollouts": len(rollouts),
        "num_examples": len(groups),
        "rollouts_per_example": k,
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "reward_std": float(np.std(rewards)) if rewards else None,
        f"avg@{k}": float(np.mean(group_means)) if group_means else None,
        "pass_threshold": threshold,
        "pass_metric": metric,
        "pass_at_k": pass_k,
        "metrics": {name: float(np.mean(v)) for name, v in sorted(metric_values.items())},
        "reward_by": reward_by_info(rollouts),
        "errors": len(errors),
        "error_examples": sorted({e.error.splitlines()[0][:200] for e in errors if e.error})[:5],
        "errors_by_cause": dict(cause_counts([e.error for e in errors]).most_common()),
        "prompt_modes": dict(sorted(Counter(r.prompt_mode for r in rollouts).items())),
        "prompt_tokens": sum(r.usage.get("prompt_tokens", 0) for r in rollouts),
        "completion_tokens": sum(r.usage.get("completion_tokens", 0) for r in rollouts),
        "latency_p50_s": _percentile(generation, 50),
        "latency_p95_s": _percentile(generation, 95),
    }
