"""Group advantages by hand: rewards [1, 0, 0, 1] have mean 0.5 and sample std sqrt(1/3)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlkit.orchestrator.advantages import (
    GroupEstimator,
    drgrpo_advantages,
    group_advantages,
    grpo_advantages,
    grpo_floats,
    zero_advantage_mask,
)

STD = math.sqrt(1 / 3)  # sum((r - 0.5)^2) / (4 - 1) = 1/3


def test_grpo_and_drgrpo_single_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    expected = [0.5 / (STD + 1e-6), -0.5 / (STD + 1e-6)] * 1
    assert grpo_advantages(rewards).tolist() == pytest.approx(
        [expected[0], expected[1], expected[1], expected[0]]
    )
    assert drgrpo_advantages(rewards).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert grpo_advantages(rewards, std_normalize=False).tolist() == pytest.approx(
        [0.5, -0.5, -0.5, 0.5]
    )


def test_grpo_batched_groups_and_degenerate_cases() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = grpo_advantages(rewards)
    assert adv[0].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # all equal: zero, not NaN
    assert grpo_advantages(torch.tensor([3.0])).tolist() == [0.0]  # group of one
    with pytest.raises(ValueError, match="rewards must be"):
        grpo_advantages(torch.zeros(2, 2, 2))


def test_group_advantages_by_size_and_by_key() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]
    by_size = group_advantages(rewards, 2, method="drgrpo")
    assert by_size == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])
    # Unequal groups from keys (e.g. an errored rollout dropped): "a" = [1, 0, 0], "b" = [1, 0].
    keys = ["a", "a", "b", "a", "b"]
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 0.0], groups=keys, method="drgrpo")
    assert adv == pytest.approx([2 / 3, -1 / 3, 0.5, -1 / 3, -0.5])
    grpo = group_advantages([1.0, 0.0, 1.0, 0.0, 0.0], groups=keys)
    # group "b": mean 0.5, sample std sqrt(0.5) -> +-0.5 / 0.707107
    assert grpo[2] == pytest.approx(0.5 / math.sqrt(0.5), abs=1e-5)


def test_group_advantages_errors() -> None:
    with pytest.raises(ValueError, match="group_size=4"):
        group_advantages([1.0, 0.0, 1.0], 4)
    with pytest.raises(ValueError, match="exactly one of"):
        group_advantages([1.0, 0.0], 2, groups=[0, 0])
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        group_advantages([1.0, 0.0], 2, method="ppo")
    with pytest.raises(ValueError, match=r"params\.eps: Input should be greater than 0"):
        group_advantages([1.0, 0.0], 2, params={"eps": -1.0})
    with pytest.raises(ValueError, match="3 keys for 2 rewards"):
        group_advantages([1.0, 0.0], groups=[0, 0, 1])


def test_zero_advantage_mask() -> None:
    assert zero_advantage_mask([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2) == [
        True,
        True,
        False,
        False,
        True,
        True,
    ]
    assert zero_advantage_mask([0.3, 0.3, 0.3], groups=[7, 7, 8]) == [True, True, True]


def _same_bits(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a, b, strict=True)
    )


def test_grpo_in_floats_equals_the_tensor_path_to_the_bit() -> None:
    """The group processor's GRPO (`grpo_floats`, no tensors) gives the numbers torch gives,
    bit for bit, on groups it was not written for: sizes 1-300, binary, uniform, huge and
    signed rewards, ties, inf and nan. A torch whose std_mean stops being sequential Welford
    in float64 fails here."""
    rng = random.Random(7)
    draws = [
        lambda: float(rng.randint(0, 1)),
        rng.random,
        lambda: rng.gauss(0.0, 1e3),
        lambda: rng.choice([0.0, -0.0, 0.25, 1.0, 1e300, -3.0, 1e-320]),
        lambda: rng.choice([0.0, 1.0, math.inf, -math.inf, math.nan]),
    ]
    for trial in range(3000):
        size = rng.choice([1, 2, 3, 7, 8, 16, 64, 300])
        draw = draws[trial % len(draws)]
        rewards = [draw() for _ in range(size)]
        eps = rng.choice([1e-6, 1e-3, 1.0])
        torch_adv = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), eps=eps).tolist()
        assert _same_bits(grpo_floats(rewards, eps), torch_adv), (rewards, eps)
    assert grpo_floats([1, 0, True]) == grpo_floats([1.0, 0.0, 1.0])  # ints count as floats
    with pytest.raises(ValueError, match="rewards must be"):
        grpo_floats([])


def test_group_estimator_validates_once_and_matches_group_advantages() -> None:
    estimator = GroupEstimator("grpo", {"eps": 0.5})
    rewards = [1.0, 0.0, 0.0, 1.0]
    assert estimator(rewards) == group_advantages(rewards, 4, params={"eps": 0.5})
    high = 0.5 / (STD + 0.5)
    assert estimator(rewards) == pytest.approx([high, -high, -high, high])
    tensor = torch.tensor(rewards, dtype=torch.float64)
    assert GroupEstimator("drgrpo")(rewards) == drgrpo_advantages(tensor).tolist()
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        GroupEstimator("ppo")
    with pytest.raises(ValueError, match=r"params\.eps: Input should be greater than 0"):
        GroupEstimator("grpo", {"eps": 0.0})
