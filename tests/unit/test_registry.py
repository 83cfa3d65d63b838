"""Losses and advantage estimators resolve by name, `module:function`, with typed parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.orchestrator.advantages import ADVANTAGES, group_advantages
from rlkit.trainer.loss import LOSSES, LossParams
from tests.helpers.losses import named_loss

USER_MODULE = """
import torch
from pydantic import Field
from rlkit.trainer.loss import LossParams, register_loss
from rlkit.orchestrator.advantages import AdvantageParams


class HalfParams(LossParams):
    factor: float = Field(0.5, gt=0, description="Scale of the REINFORCE objective.")


@register_loss("half_reinforce", params=HalfParams)
def half_reinforce(x, p):
    return p.factor * x.advantages * x.logprobs, {}


def plain(x, p):
    return x.advantages * x.logprobs, {}


def rank_advantages(rewards, p):
    return rewards.argsort().argsort().to(rewards.dtype) - (len(rewards) - 1) / 2
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_losses_xyz.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_losses_xyz"


def test_user_loss_by_module_path_with_its_own_params(user_module: str) -> None:
    entry = LOSSES.get(f"{user_module}:half_reinforce")
    assert entry.params.__name__ == "HalfParams" and entry.validate({"factor": 2.0}).factor == 2.0
    with pytest.raises(ValueError, match=r"params\.factor: Input should be greater than 0"):
        entry.validate({"factor": -1})
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = named_loss(
        f"{user_module}:half_reinforce",
        logprobs,
        logprobs.detach(),
        logprobs.detach(),
        torch.tensor([1.0]),
        torch.ones(1, 2),
        factor=2.0,
    )
    assert loss.item() == pytest.approx(3.0)  # -(2 * (-1 - 2)) / 2 tokens


def test_plain_function_takes_the_base_params(user_module: str) -> None:
    entry = LOSSES.get(f"{user_module}:plain")
    assert entry.params is LossParams
    with pytest.raises(ValueError, match="cannot import no_such_mod_xyz"):
        LOSSES.get("no_such_mod_xyz:fn")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        LOSSES.get(f"{user_module}:missing")


def test_user_advantage_estimator(user_module: str) -> None:
    assert ADVANTAGES.names() == ["drgrpo", "grpo"]
    adv = group_advantages([0.1, 0.9, 0.5], 3, method=f"{user_module}:rank_advantages")
    assert adv == [-1.0, 1.0, 0.0]
