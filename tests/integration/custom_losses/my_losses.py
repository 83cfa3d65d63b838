"""A user's own loss, outside rlkit: GRPO's objective scaled by a parameter of its own.

`rlkit train` finds it as `[loss] name = "my_losses:scaled_grpo"` when this folder is on
PYTHONPATH; its parameter model validates `[loss] params` like a built-in loss's.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from rlkit.trainer.loss import ClipParams, LossInputs, register_loss


class ScaledParams(ClipParams):
    scale: float = Field(0.5, gt=0, description="Multiplies the PPO-clip objective.")


@register_loss("scaled_grpo", params=ScaledParams)
def scaled_grpo(x: LossInputs, p: ScaledParams) -> tuple[Tensor, dict[str, Tensor]]:
    ratio = x.ratio
    clipped = ratio.clamp(1 - p.eps_low, 1 + p.eps_high)
    objective = p.scale * (ratio * x.advantages).minimum(clipped * x.advantages)
    return objective, {"custom_scale": (ratio.detach() * 0 + p.scale)}
