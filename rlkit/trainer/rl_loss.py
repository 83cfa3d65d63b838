"""The configured RL loss, resolved once (when `[loss]` validates) into what the trainer calls.

`ResolvedLoss` holds the registered loss, its validated parameters, the mismatch correction
and which policy is "old" (`loss.old_policy`, see `OldPolicy`). The trainer uses it as the step's
loss function and as the step's normaliser, so neither the loss nor its parameters are looked up
again after the config is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rlkit.registry import Entry
from rlkit.trainer.loss import Correction, LossParams, compute_policy_loss, count_units
from rlkit.trainer.packing import MicroBatch, TokenSequence

# The policy the PPO ratio r = pi_theta / pi_old and the correction k = pi_old / pi_inf use:
# "recomputed": pi_old from a no-grad pass at the start of the step (mini-steps move r);
# "engine": the engine's logprobs (r = pi_theta / pi_inf, k = 1: the papers' asynchronous use);
# "current": the detached current policy (r = 1 in value, k = sg(pi_theta) / pi_inf:
#   INTELLECT-3's single-step asynchronous objective).
OldPolicy = Literal["recomputed", "engine", "current"]


@dataclass(frozen=True)
class ResolvedLoss:
    """The trainer's loss function (`rlkit.trainer.trainer.MicroBatchLoss`) and normaliser."""

    entry: Entry
    params: LossParams
    correction: Correction
    old_policy: OldPolicy

    @property
    def recomputes_old(self) -> bool:
        """Whether the step must compute pi_old before its first update."""
        return self.old_policy == "recomputed"

    def normalizer(self, seqs: list[TokenSequence]) -> float:
        """What a mini-batch's loss divides by (`loss.count_units` of its sequences)."""
        tokens = torch.tensor([sum(s.loss_mask[1:]) for s in seqs], dtype=torch.float32)
        return float(max(count_units(tokens, self.params.agg), 1))

    def __call__(
        self,
        mb: MicroBatch,
        logprobs: Tensor,
        recomputed_old: Tensor | None,
        entropy: Tensor,
        normalizer: float,
    ) -> tuple[Tensor, dict[str, float]]:
        """The loss on one micro-batch, divided by the global `normalizer`; `recomputed_old` is
        pi_old when the step recomputed it."""
        d = logprobs.device
        inference = mb.inference_logprobs.to(d)
        if self.old_policy == "recomputed":
            if recomputed_old is None:
                raise ValueError("loss.old_policy = 'recomputed' but no pi_old was computed")
            old = recomputed_old
        else:
            old = logprobs.detach() if self.old_policy == "current" else inference
        return compute_policy_loss(
            self.entry,
            self.params,
            self.correction,
            logprobs,
            old,
            inference,
            mb.advantages.to(d),
            mb.loss_mask.to(d),
            normalizer=normalizer,
            entropy=entropy,
            ref_logprobs=None if mb.ref_logprobs is None else mb.ref_logprobs.to(d),
            trainer_logprobs=logprobs if recomputed_old is None else recomputed_old,
        )
