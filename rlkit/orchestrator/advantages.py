"""Group-relative advantages: every rollout is compared with the other rollouts of its prompt.

GRPO (DeepSeekMath) centres rewards on the group mean and divides by the group std; Dr.GRPO
drops the std division because it up-weights groups that are nearly solved or nearly failed.
A group whose rewards are all equal gives zero advantage everywhere and no learning signal;
`zero_advantage_mask` finds those rollouts so the orchestrator can drop or count them.

Estimators are registered by name with their parameter model (`ADVANTAGES`, like the losses):
`[orchestrator] advantage = "grpo"` with `advantage_params`, or a user function
`fn(rewards [G], params) -> advantages [G]` named `"my_pkg.my_adv:fn"` or by an entry point in
group `rlkit.advantages`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from rlkit.config import Config
from rlkit.registry import Registry


class AdvantageParams(Config):
    """Parameters every advantage estimator accepts (none yet)."""


class GRPOAdvantageParams(AdvantageParams):
    eps: float = Field(1e-6, gt=0, description="Added to the group std before dividing.")


def grpo_advantages(rewards: Tensor, std_normalize: bool = True, eps: float = 1e-6) -> Tensor:
    """(r - mean) / (std + eps) over the last dim: [G] for one group or [num_groups, G].

    std is the unbiased sample std (as in TRL); a group of one rollout gets advantage 0.
    """
    if rewards.dim() not in (1, 2) or rewards.shape[-1] == 0:
        raise ValueError(f"rewards must be [G] or [num_groups, G], got {tuple(rewards.shape)}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if not std_normalize or rewards.shape[-1] == 1:
        return rewards - rewards.mean(dim=-1, keepdim=True)
    # one fused call: on a group of 8 each torch op costs more than its arithmetic
    std, mean = torch.std_mean(rewards, dim=-1, keepdim=True)
    return (rewards - mean) / (std + eps)


def drgrpo_advantages(rewards: Tensor) -> Tensor:
    """Dr.GRPO: r - group mean, no std division ([G] or [num_groups, G])."""
    return grpo_advantages(rewards, std_normalize=False)


AdvantageFn = Callable[[Tensor, Any], Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry(
    "advantage estimator", "rlkit.advantages", AdvantageParams
)


@ADVANTAGES.register("grpo", params=GRPOAdvantageParams)
def grpo(rewards: Tensor, p: GRPOAdvantageParams) -> Tensor:
    """GRPO (DeepSeekMath): (r - mean) / (std + eps) within the group."""
    return grpo_advantages(rewards, eps=p.eps)


@ADVANTAGES.register("drgrpo")
def drgrpo(rewards: Tensor, p: AdvantageParams) -> Tensor:
    """Dr.GRPO: r - mean, no std division."""
    return drgrpo_advantages(rewards)


def _group_index(
    n: int, group_size: int | None, groups: Sequence[Hashable] | None
) -> list[list[int]]:
    """Indices of each group, from a fixed group size or a group key per rollout."""
    if (group_size is None) == (groups is None):
        raise ValueError("pass exactly one of group_size (int) or groups (one key per reward)")
    if groups is not None:
        if len(groups) != n:
            raise ValueError(f"groups has {len(groups)} keys for {n} rewards")
        members: dict[Hashable, list[int]] = {}
        for i, key in enumerate(groups):
            members.setdefault(key, []).append(i)
        return list(members.values())
    assert group_size is not None
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards cannot be split into groups of group_size={group_size}")
    return [list(range(start, start + group_size)) for start in range(0, n, group_size)]


def grpo_floats(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """`grpo_advantages` of one group [G] in Python floats, equal to it to the bit.

    torch computes `std_mean` on the CPU by Welford's algorithm in float64, one value after
    another; these are the same steps in the same order (test_advantages keeps them equal).
    The group processor calls it once per finished group: on a group of 8, the six tensor ops
    of `grpo_advantages` cost about ten times the arithmetic (a third of the processor's time).
    """
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError("rewards must be [G] or [num_groups, G], got (0,)")
    n, mean, m2 = 0, 0.0, 0.0
    for x in values:
        n += 1
        delta = x - mean
        mean = mean + delta / n
        m2 = m2 + delta * (x - mean)
    if n == 1:
        return [values[0] - mean]
    std = math.sqrt(m2 / (n - 1))
    return [(x - mean) / (std + eps) for x in values]


class GroupEstimator:
    """A registered estimator with its parameters validated once: `estimator(rewards)` gives
    the advantages of one group's rewards (the group processor's per-group call).

    An unknown `method` or bad `params` raises ValueError.
    """

    def __init__(self, method: str = "grpo", params: dict[str, Any] | None = None) -> None:
        self.method = method
        self.entry = ADVANTAGES.get(method)
        self.params = self.entry.validate(params or {})

    def __call__(self, rewards: Sequence[float]) -> list[float]:
        if self.entry.fn is grpo:  # the built-in: the same numbers without tensors
            return grpo_floats(rewards, self.params.eps)  # type: ignore[attr-defined]
        group = torch.tensor(list(rewards), dtype=torch.float64)
        values = self.entry.fn(group, self.params)
        if values.shape != group.shape:
            raise ValueError(
                f"advantage estimator {self.method!r} returned shape {tuple(values.shape)} "
                f"for {len(rewards)} rewards"
            )
        return values.tolist()


def group_advantages(
    rewards: Sequence[float],
    group_size: int | None = None,
    *,
    groups: Sequence[Hashable] | None = None,
    method: str = "grpo",
    params: dict[str, Any] | None = None,
) -> list[float]:
    """Advantages for a flat list of rewards, in the same order, by a registered estimator.

    Groups are consecutive blocks of `group_size`, or given by `groups` (a key per rollout,
    e.g. the example id; groups may then differ in size after errored rollouts are dropped).
    An unknown `method` or bad `params` raises ValueError.
    """
    estimator = GroupEstimator(method, params)
    advantages = [0.0] * len(rewards)
    for index in _group_index(len(rewards), group_size, groups):
        values = estimator([rewards[i] for i in index])
        for i, value in zip(index, values, strict=True):
            advantages[i] = value
    return advantages


def zero_advantage_mask(
    rewards: Sequence[float],
    group_size: int | None = None,
    *,
    groups: Sequence[Hashable] | None = None,
    atol: float = 1e-8,
) -> list[bool]:
    """True for every rollout whose group's rewards are all equal (within atol): no signal."""
    mask = [False] * len(rewards)
    for index in _group_index(len(rewards), group_size, groups):
        values = [rewards[i] for i in index]
        flat = max(values) - min(values) <= atol
        for i in index:
            mask[i] = flat
    return mask
