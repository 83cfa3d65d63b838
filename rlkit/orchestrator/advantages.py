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
    entry = ADVANTAGES.get(method)
    p = entry.validate(params or {})
    advantages = [0.0] * len(rewards)
    for index in _group_index(len(rewards), group_size, groups):
        group = torch.tensor([rewards[i] for i in index], dtype=torch.float64)
        values = entry.fn(group, p)
        if values.shape != group.shape:
            raise ValueError(
                f"advantage estimator {method!r} returned shape {tuple(values.shape)} "
                f"for {len(index)} rewards"
            )
        for i, value in zip(index, values.tolist(), strict=True):
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
