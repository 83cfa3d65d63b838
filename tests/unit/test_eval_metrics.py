"""pass@k against hand-computed values, and the eval summary."""

from __future__ import annotations

import math

import pytest

from rlkit.envs import Rollout
from rlkit.eval import pass_at_k, summarize
from rlkit.eval.metrics import k_values


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 0, 2, 0.0),
        (4, 3, 2, 1.0),  # fewer failures than k: always passes
        (4, 4, 4, 1.0),
        (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 100/200
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(3, 1, 4)


def test_k_values_are_powers_of_two_plus_k() -> None:
    assert k_values(1) == [1]
    assert k_values(3) == [1, 2, 3]
    assert k_values(8) == [1, 2, 4, 8]


def _rollout(example: int, reward: float, **kwargs: object) -> Rollout:
    return Rollout(env_id="e", example_id=example, reward=reward, **kwargs)


def test_summarize_rewards_pass_at_k_metrics_errors_tokens_latency() -> None:
    rollouts = [
        _rollout(
            0,
            1.0,
            metrics={"acc": 1.0},
            usage={"prompt_tokens": 10, "completion_tokens": 4},
            timings={"generation_s": 1.0},
        ),
        _rollout(
            0,
            0.0,
            metrics={"acc": 0.0},
            usage={"prompt_tokens": 10, "completion_tokens": 6},
            timings={"generation_s": 3.0},
        ),
        _rollout(1, 0.5, metrics={"acc": 0.5}, timings={"generation_s": 2.0}),
        _rollout(1, 0.9, error="HTTP 500", timings={"generation_s": 5.0}),  # counts as 0, failure
    ]
    summary = summarize(rollouts, k=2)
    assert summary["num_rollouts"] == 4
    assert summary["num_examples"] == 2
    assert summary["reward_mean"] == pytest.approx((1.0 + 0.0 + 0.5 + 0.0) / 4)
    assert summary["avg@2"] == pytest.approx(((1.0 + 0.0) / 2 + (0.5 + 0.0) / 2) / 2)
    # example 0: 1 of 2 succeed; example 1: none (0.5 < 1.0, the errored one never counts)
    assert summary["pass_at_k"] == {"pass@1": pytest.approx(0.25), "pass@2": pytest.approx(0.5)}
    assert summary["metrics"] == {"acc": pytest.approx(0.5)}  # errored rollouts excluded
    assert summary["errors"] == 1
    assert summary["error_examples"] == ["HTTP 500"]
    assert summary["prompt_tokens"] == 20
    assert summary["completion_tokens"] == 10
    assert summary["latency_p50_s"] == pytest.approx(2.5)
    assert summary["latency_p95_s"] == pytest.approx(4.7)


def test_summarize_threshold_and_metric_decide_success() -> None:
    rollouts = [_rollout(0, 0.6, metrics={"exact": 0.0}), _rollout(0, 0.2, metrics={"exact": 1.0})]
    assert summarize(rollouts, k=2, threshold=0.5)["pass_at_k"]["pass@1"] == pytest.approx(0.5)
    by_metric = summarize(rollouts, k=2, threshold=1.0, metric="exact")
    assert by_metric["pass_at_k"] == {"pass@1": pytest.approx(0.5), "pass@2": pytest.approx(1.0)}


def test_summarize_splits_reward_by_task_and_level() -> None:
    rollouts = [
        _rollout(0, 1.0, info={"task": "sudoku", "level": "easy"}),
        _rollout(0, 0.5, info={"task": "sudoku", "level": "easy"}),
        _rollout(1, 0.9, info={"task": "countdown", "level": "hard"}, error="boom"),  # counts 0
        _rollout(2, 1.0, info={"task": "countdown", "level": "easy"}),
    ]
    assert summarize(rollouts, k=2)["reward_by"] == {
        "task": {"countdown": pytest.approx(0.5), "sudoku": pytest.approx(0.75)},
        "level": {"easy": pytest.approx(2.5 / 3), "hard": 0.0},
    }
    assert summarize([_rollout(0, 1.0)], k=1)["reward_by"] == {}


def test_summarize_empty_run() -> None:
    summary = summarize([], k=3)
    assert summary["num_rollouts"] == 0
    assert summary["reward_mean"] is None
    assert summary["pass_at_k"] == {}
