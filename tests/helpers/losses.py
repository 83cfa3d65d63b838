"""A loss by name, as a `[loss]` config resolves it, called through the trainer's one entry
(`compute_policy_loss`): the tests' shorthand for hand-computed values."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rlkit.trainer.config import LossConfig
from rlkit.trainer.loss import compute_policy_loss


def named_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    inference_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    correction: str | None = None,
    normalizer: float | None = None,
    segment_ids: Tensor | None = None,
    entropy: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Loss `name` with `params` (and `correction`, when given) on these tensors."""
    fields: dict[str, Any] = {"name": name, "params": params}
    if correction is not None:
        fields["mismatch_correction"] = correction
    resolved = LossConfig.model_validate(fields).resolved
    return compute_policy_loss(
        resolved.entry,
        resolved.params,
        resolved.correction,
        logprobs,
        old_logprobs,
        inference_logprobs,
        advantages,
        loss_mask,
        normalizer=normalizer,
        segment_ids=segment_ids,
        entropy=entropy,
        ref_logprobs=ref_logprobs,
    )
