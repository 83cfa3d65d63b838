"""The policy-loss family: one registered function per loss, one entry `compute_policy_loss`.

Three policies are kept apart (decoupled PPO, as in AReaL and prime-rl): pi_inf, the engine
that sampled the tokens (`inference_logprobs`); pi_old, the trainer's policy at the start of the
step (`old_logprobs`); pi_theta, the policy being optimised (`logprobs`, with grad). Every loss is
a per-token objective J (to maximise) of the PPO-style ratio r = pi_theta / pi_old, multiplied
by a mismatch correction w(k) of the mismatch k = pi_old / pi_inf (without gradient):

- correction "icepop" (Ring-1T eq. 1-2): w = M(k) = k if alpha <= k <= beta else 0: tokens the
  trainer and engine disagree on get no gradient at all, the rest are calibrated;
- correction "tis" (truncated importance sampling): w = min(k, tis_cap);
- correction "none": w = 1.

The losses (each a function below, registered under its name with its own parameter model):

- grpo: PPO clip with clip-higher (eps_low != eps_high) and optional dual clip `clip_c`
  (for A < 0 the objective is at least clip_c * A).
- icepop: PPO clip, always with the icepop correction (it *is* GRPO + the IcePop mask).
- tis: PPO clip, always with the tis correction.
- cispo (MiniMax-M1): sg(clip(r, 1-eps_low, 1+eps_high)) * A * logprobs; every token keeps
  its gradient, only the weight is clipped. eps_low=1 means no lower bound, as in the paper.
- gspo (Qwen): sequence ratio s = exp(mean_t(logprobs - old)) clipped with its own (tiny)
  range; per token s is written as sg(s) * pi/sg(pi) (GSPO-token), which with the default
  "seq-mean-token-mean" aggregation gives exactly the sequence-level GSPO gradient.
- gppo (Klear): forward value of PPO clip, but a clipped token passes gradient
  (1 +/- eps) * A instead of 0 (the clip bound is written as (1+eps) * r / sg(r)).

Which "old" policy the trainer passes is the config's `loss.old_policy` (`rlkit.trainer.rl_loss`):
"recomputed" is pi_old from a no-grad pass at the start of the step, and `[trainer] mini_batches
= N` optimiser steps move r away from 1 so clipping acts; "engine" is pi_inf (the papers'
asynchronous use: r = pi_theta / pi_inf, k = 1); "current" is the detached current policy
(r = 1 in value, k = sg(pi_theta) / pi_inf), INTELLECT-3's single-step asynchronous objective.
Unset, it is the loss's registered `old_policy` ("current" for icepop and tis), else "engine".

`seq_reject_below` (INTELLECT-3) zeroes a whole sequence when any counted token has k below it.
Zeroed tokens (IcePop mask, rejection) stay in the denominator; loss_mask 0 tokens never count.

Normalising across micro-batches and ranks: by default a call divides by its own count (counted
tokens for "token-mean", sequences with at least one counted token for "seq-mean-token-mean").
For exact gradient accumulation pass `normalizer=` the count of the whole optimiser batch (same
unit); then the sum of the micro-batch losses (and their gradients) equals the full-batch loss.
A sequence must not be split across micro-batches. Data-parallel FSDP averages gradients over
ranks, so there pass `normalizer = global_count / world_size`.

A custom loss is a function `fn(x: LossInputs, p: Params) -> (objective [B, T], stats)` in any
importable module, named in the config as `"my_pkg.my_loss:fn"` (or an entry point in group
`rlkit.losses`); decorate it with `@register_loss("name", params=MyParams)` to give it
parameters (a subclass of `LossParams`), and call `rlkit.trainer.reductions.declare_metrics` for
any metric that is not a token mean.

Metrics (floats; means over this call's counted tokens unless noted): mismatch_kl (k3 = k - 1 -
log k, unbiased for KL(pi_inf || pi_old) since the engine sampled the tokens),
mismatch_extreme_frac (R3 eq. 3: share of tokens with max(k, 1/k) > extreme_tau), clip_frac_low /
clip_frac_high (tokens whose gradient the clip cuts; for cispo, weights clipped), ratio_mean,
icepop_masked_low_frac / icepop_masked_high_frac, dual_clip_frac (grpo with clip_c),
tis_truncated_frac, seq_rejected (a count), entropy (if given), policy_loss, ref_kl, sft_loss,
loss, and the counts num_tokens / num_sequences for weighting metrics across micro-batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from pydantic import Field
from torch import Tensor

from rlkit.config import Config
from rlkit.registry import Entry, Registry
from rlkit.trainer.reductions import Reduction, declare_metrics

Correction = Literal["icepop", "tis", "none"]  # mismatch corrections, see below

Aggregation = Literal["token-mean", "seq-mean-token-mean"]


class LossParams(Config):
    """Parameters every loss accepts: aggregation, mismatch correction, auxiliary terms."""

    agg: Aggregation = Field(
        "token-mean", description="Divide by counted tokens, or average per-sequence means."
    )
    alpha: float = Field(
        0.5, ge=0, le=1, description="icepop correction: lowest pi_old/pi_inf kept."
    )
    beta: float = Field(5.0, ge=1, description="icepop correction: highest pi_old/pi_inf kept.")
    tis_cap: float = Field(2.0, gt=0, description="tis correction: cap of the importance weight.")
    seq_reject_below: float | None = Field(
        None, gt=0, description="Zero a whole sequence if any token's k is below this."
    )
    extreme_tau: float = Field(2.0, gt=1, description="tau of the extreme-token fraction F(tau).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to reference logprobs.")
    sft_on_correct: bool = Field(
        False, description="Add Klear's NLL on positive-advantage sequences."
    )
    sft_coef: float = Field(0.1, ge=0, description="Weight of the sft_on_correct NLL.")


class ClipParams(LossParams):
    eps_low: float = Field(0.2, ge=0, le=1, description="Lower clip range: r >= 1 - eps_low.")
    eps_high: float = Field(0.28, ge=0, description="Upper clip range: r <= 1 + eps_high.")


class GRPOParams(ClipParams):
    clip_c: float | None = Field(
        None, gt=1, description="Dual clip: for A < 0 the objective is at least clip_c * A."
    )


class CISPOParams(ClipParams):
    eps_low: float = Field(1.0, ge=0, le=1, description="Lower weight clip (1 = none).")


class GSPOParams(ClipParams):
    agg: Aggregation = Field("seq-mean-token-mean", description="GSPO is sequence-level.")
    eps_low: float = Field(3e-4, ge=0, le=1, description="Lower clip of the sequence ratio.")
    eps_high: float = Field(4e-4, ge=0, description="Upper clip of the sequence ratio.")


class Sequences:
    """Which sequence each token belongs to: a row, or a `segment_ids` span in packed rows."""

    def __init__(self, shape: torch.Size, segment_ids: Tensor | None, device: torch.device):
        if segment_ids is None:
            rows = torch.arange(shape[0], device=device)
            self.index = rows[:, None].expand(shape)
            self.count = shape[0]
        else:
            _, inverse = torch.unique(segment_ids, return_inverse=True)
            self.index = inverse
            self.count = int(inverse.max()) + 1 if inverse.numel() else 0

    def sum(self, values: Tensor) -> Tensor:
        """Per-sequence sum of a [B, T] tensor -> [num_sequences]."""
        out = values.new_zeros(self.count)
        return out.index_add(0, self.index.reshape(-1), values.reshape(-1))

    def spread(self, per_sequence: Tensor) -> Tensor:
        """A [num_sequences] tensor back onto tokens -> [B, T]."""
        return per_sequence[self.index]


def _aggregate(
    per_token: Tensor,
    mask: Tensor,
    sequences: Sequences,
    agg: str,
    normalizer: float | None,
) -> Tensor:
    """Sum the counted tokens' values and divide by `normalizer`, or by this call's own
    `count_units` (see module)."""
    masked = torch.where(mask, per_token, 0.0)
    tokens_per_seq = sequences.sum(mask.float())
    if agg == "token-mean":
        total = masked.sum()
    else:
        has_tokens = tokens_per_seq > 0
        total = (sequences.sum(masked)[has_tokens] / tokens_per_seq[has_tokens]).sum()
    if normalizer is not None:
        return total / normalizer
    return total / count_units(tokens_per_seq, agg).clamp(min=1)


def count_units(tokens_per_sequence: Tensor, agg: str) -> Tensor:
    """The one normaliser: what a loss divides by, from each sequence's counted tokens.

    "token-mean" counts tokens, "seq-mean-token-mean" sequences with at least one counted token.
    A call counts its own micro-batch; the trainer counts the whole optimiser batch once
    (`ResolvedLoss.normalizer`) and passes it as `normalizer` to every micro-batch.
    """
    if agg == "token-mean":
        return tokens_per_sequence.sum()
    return (tokens_per_sequence > 0).sum()


def _ppo_clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    return torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)


def sft_on_correct_loss(
    logprobs: Tensor,
    loss_mask: Tensor,
    advantages: Tensor,
    *,
    agg: Aggregation = "token-mean",
    normalizer: float | None = None,
    segment_ids: Tensor | None = None,
) -> Tensor:
    """Klear's auxiliary NLL on tokens of sequences with positive advantage (to minimise).

    It uses the policy loss's denominator (all counted tokens, or sequences), so it can be added
    with a weight (0.1 in Klear) and keeps the same micro-batch normalisation.
    """
    mask = loss_mask.bool()
    adv = advantages[:, None].expand(mask.shape) if advantages.dim() == 1 else advantages
    nll = torch.where(mask & (adv > 0), -logprobs.float(), 0.0)
    sequences = Sequences(mask.shape, segment_ids, mask.device)
    return _aggregate(nll, mask, sequences, agg, normalizer)


def reference_kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    agg: Aggregation = "token-mean",
    normalizer: float | None = None,
    segment_ids: Tensor | None = None,
) -> Tensor:
    """k3 estimate of KL(pi_theta || pi_ref) on sampled tokens: exp(d) - d - 1, d = ref - pi."""
    mask = loss_mask.bool()
    delta = torch.where(mask, ref_logprobs.float().detach() - logprobs.float(), 0.0)
    k3 = torch.exp(delta) - delta - 1
    sequences = Sequences(mask.shape, segment_ids, mask.device)
    return _aggregate(k3, mask, sequences, agg, normalizer)


@dataclass
class LossInputs:
    """What a loss function sees; masked positions already hold 0 (never NaN)."""

    logprobs: Tensor  # log pi_theta [B, T], with grad
    old: Tensor  # log pi_old [B, T] (the "old" policy of the PPO ratio), no grad
    advantages: Tensor  # [B, T]
    mask: Tensor  # [B, T] bool: tokens that count
    sequences: Sequences

    @property
    def ratio(self) -> Tensor:
        """r = pi_theta / pi_old per token."""
        return torch.exp(self.logprobs - self.old)


LossFn = Callable[[LossInputs, Any], tuple[Tensor, dict[str, Tensor]]]
LOSSES: Registry[LossFn] = Registry("loss", "rlkit.losses", LossParams)
register_loss = LOSSES.register
declare_metrics(Reduction.SUM, "num_tokens", "num_sequences", "seq_rejected")
declare_metrics(Reduction.NORMALISED, "loss", "policy_loss", "ref_kl", "sft_loss")


def _clip_stats(x: LossInputs, ratio: Tensor, p: ClipParams) -> dict[str, Tensor]:
    """Tokens whose PPO gradient is cut: ratio below the band with A<0, above it with A>0."""
    ratio = ratio.detach()
    adv = x.advantages
    return {
        "clip_frac_low": (ratio < 1 - p.eps_low) & (adv < 0),
        "clip_frac_high": (ratio > 1 + p.eps_high) & (adv > 0),
        "ratio_mean": ratio,
    }


def _clipped(x: LossInputs, p: ClipParams) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip of r with the clip-higher range, and its clip statistics."""
    ratio = x.ratio
    return _ppo_clip(ratio, x.advantages, p.eps_low, p.eps_high), _clip_stats(x, ratio, p)


@register_loss("grpo", params=GRPOParams)
def grpo(x: LossInputs, p: GRPOParams) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip with clip-higher; with `clip_c`, the dual clip floor c * A for A < 0."""
    objective, stats = _clipped(x, p)
    if p.clip_c is not None:
        floor = p.clip_c * x.advantages
        dual = (x.advantages < 0) & (objective < floor)
        objective = torch.where(dual, floor, objective)
        stats["dual_clip_frac"] = dual
    return objective, stats


@register_loss("icepop", params=ClipParams, correction="icepop", old_policy="current")
def icepop(x: LossInputs, p: ClipParams) -> tuple[Tensor, dict[str, Tensor]]:
    """IcePop (Ring-1T): PPO clip; the mask M(k) is its fixed mismatch correction."""
    return _clipped(x, p)


@register_loss("tis", params=ClipParams, correction="tis", old_policy="current")
def tis(x: LossInputs, p: ClipParams) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip; the truncated importance weight min(k, tis_cap) is its fixed correction."""
    return _clipped(x, p)


@register_loss("cispo", params=CISPOParams)
def cispo(x: LossInputs, p: CISPOParams) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1): the clipped ratio is a weight without gradient on A * logprobs."""
    ratio = x.ratio.detach()
    objective = ratio.clamp(1 - p.eps_low, 1 + p.eps_high) * x.advantages * x.logprobs
    stats = {
        "clip_frac_low": ratio < 1 - p.eps_low,
        "clip_frac_high": ratio > 1 + p.eps_high,
        "ratio_mean": ratio,
    }
    return objective, stats


@register_loss("gspo", params=GSPOParams)
def gspo(x: LossInputs, p: GSPOParams) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Qwen): PPO clip of the length-normalised sequence ratio, written per token."""
    seqs, logprobs = x.sequences, x.logprobs
    log_ratio = torch.where(x.mask, logprobs - x.old, 0.0)
    tokens = seqs.sum(x.mask.float()).clamp(min=1)
    seq_log_ratio = seqs.sum(log_ratio) / tokens
    ratio = torch.exp(seqs.spread(seq_log_ratio.detach()) + logprobs - logprobs.detach())
    return _ppo_clip(ratio, x.advantages, p.eps_low, p.eps_high), _clip_stats(x, ratio, p)


@register_loss("gppo", params=ClipParams)
def gppo(x: LossInputs, p: ClipParams) -> tuple[Tensor, dict[str, Tensor]]:
    """GPPO (Klear): PPO clip's value, but clipped tokens pass the gradient (1 +/- eps) * A."""
    ratio = x.ratio
    ratio_grad = ratio / ratio.detach()  # value 1, gradient d log pi
    bound = torch.where(
        ratio.detach() > 1 + p.eps_high,
        (1 + p.eps_high) * ratio_grad,
        torch.where(ratio.detach() < 1 - p.eps_low, (1 - p.eps_low) * ratio_grad, ratio),
    )
    return torch.minimum(ratio * x.advantages, bound * x.advantages), _clip_stats(x, ratio, p)


def mismatch_weight(
    correction: str, k: Tensor, p: LossParams, stats: dict[str, Tensor]
) -> Tensor | None:
    """w(k) on k = pi_old / pi_inf (no gradient); None for "none". Adds its statistics."""
    if correction == "icepop":
        stats["icepop_masked_low_frac"] = k < p.alpha
        stats["icepop_masked_high_frac"] = k > p.beta
        return torch.where((k >= p.alpha) & (k <= p.beta), k, 0.0)
    if correction == "tis":
        stats["tis_truncated_frac"] = k > p.tis_cap
        return k.clamp(max=p.tis_cap)
    if correction == "none":
        return None
    raise ValueError(
        f"unknown mismatch correction {correction!r}; expected one of {get_args(Correction)}"
    )


def loss_correction(entry: Entry, configured: str) -> str:
    """The correction a loss applies: its own fixed one (icepop, tis) or the configured one."""
    return entry.options.get("correction", configured)


def _check_shapes(tensors: dict[str, Tensor | None], advantages: Tensor) -> None:
    """All [B, T] inputs share one shape; advantages are [B] or [B, T]."""
    shape = tensors["logprobs"].shape  # type: ignore[union-attr]
    if len(shape) != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(shape)}")
    for label, tensor in tensors.items():
        if tensor is not None and tensor.shape != shape:
            raise ValueError(
                f"{label} must have the shape of logprobs {tuple(shape)}, got {tuple(tensor.shape)}"
            )
    if advantages.shape not in (shape, shape[:1]):
        raise ValueError(
            f"advantages must be [B] = [{shape[0]}] or [B, T] = {list(shape)}, "
            f"got {tuple(advantages.shape)}"
        )


def compute_policy_loss(
    entry: Entry,
    p: LossParams,
    correction: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    inference_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    normalizer: float | None = None,
    segment_ids: Tensor | None = None,
    entropy: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    trainer_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise and float metrics of the resolved loss `entry` with its validated
    params `p` (`[loss]` resolves them once: `rlkit.trainer.rl_loss.ResolvedLoss`, which calls
    this); see the module docstring.

    Shapes: logprobs (pi_theta) / old_logprobs (pi_old) / inference_logprobs (pi_inf) /
    loss_mask [B, T], advantages [B] or [B, T]. `correction` ("icepop" | "tis" | "none"):
    `loss_correction(entry, configured)`. normalizer: whole-batch count for exact
    micro-batch/rank accumulation; segment_ids ([B, T] ints): sequence id per token when several
    sequences are packed into one row (default one sequence per row); entropy ([B, T],
    reported); ref_logprobs with params kl_coef > 0: k3 KL to a reference.
    `trainer_logprobs` (default `old_logprobs`) is what the mismatch metrics compare with the
    engine: the trainer's policy, also when the loss takes pi_inf as its old policy.
    """
    if normalizer is not None and not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    if p.kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the reference model's logprobs)")
    _check_shapes(
        {
            "old_logprobs": old_logprobs,
            "inference_logprobs": inference_logprobs,
            "loss_mask": loss_mask,
            "segment_ids": segment_ids,
            "entropy": entropy,
            "ref_logprobs": ref_logprobs,
            "logprobs": logprobs,
        },
        advantages,
    )
    mask = loss_mask.bool()
    # Zero every masked position first: padding may hold garbage (inf ratios) whose NaN gradient
    # would survive a later torch.where.
    logprobs = logprobs.float().masked_fill(~mask, 0.0)
    old = old_logprobs.detach().float().masked_fill(~mask, 0.0)
    inference = inference_logprobs.detach().float().masked_fill(~mask, 0.0)
    adv = advantages.detach().float()
    adv = (adv[:, None].expand(mask.shape) if adv.dim() == 1 else adv).masked_fill(~mask, 0.0)
    sequences = Sequences(mask.shape, segment_ids, mask.device)

    objective, stats = entry.fn(LossInputs(logprobs, old, adv, mask, sequences), p)
    k = torch.exp(old - inference)
    weight = mismatch_weight(correction, k, p, stats)
    if weight is not None:
        objective = weight * objective
    if p.seq_reject_below is not None:
        rejected_seq = sequences.sum((mask & (k < p.seq_reject_below)).float()) > 0
        objective = torch.where(sequences.spread(rejected_seq), 0.0, objective)
        stats["seq_rejected"] = rejected_seq
    pg_loss = -_aggregate(objective, mask, sequences, p.agg, normalizer)
    loss = pg_loss

    extra: dict[str, Tensor] = {"policy_loss": pg_loss.detach()}
    shared: dict[str, Any] = {"agg": p.agg, "normalizer": normalizer, "segment_ids": segment_ids}
    if ref_logprobs is not None:
        ref_kl = reference_kl_loss(logprobs, ref_logprobs, mask, **shared)
        loss = loss + p.kl_coef * ref_kl
        extra["ref_kl"] = ref_kl.detach()
    if p.sft_on_correct:
        sft = sft_on_correct_loss(logprobs, mask, adv, **shared)
        loss = loss + p.sft_coef * sft
        extra["sft_loss"] = sft.detach()
    extra["loss"] = loss.detach()
    extra["num_sequences"] = (sequences.sum(mask.float()) > 0).sum().float()
    if entropy is not None:
        stats["entropy"] = entropy.detach()
    trainer = old if trainer_logprobs is None else trainer_logprobs.detach().float()
    return loss, _metrics(stats, extra, mask, trainer.masked_fill(~mask, 0.0), inference, p)


def _metrics(
    stats: dict[str, Tensor],
    extra: dict[str, Tensor],
    mask: Tensor,
    trainer: Tensor,
    inference: Tensor,
    p: LossParams,
) -> dict[str, float]:
    """Means over counted tokens (sequence counts for rejection), converted in one sync."""
    count = mask.sum().clamp(min=1)

    def token_mean(values: Tensor) -> Tensor:
        return torch.where(mask, values.float(), 0.0).sum() / count

    # k3 = k - 1 - log k with k = pi_old / pi_inf: unbiased for KL(pi_inf || pi_old)
    # because the tokens were sampled by the engine.
    delta = trainer - inference
    values = {
        "mismatch_kl": token_mean(torch.exp(delta) - delta - 1),
        "mismatch_extreme_frac": token_mean(delta.abs() > math.log(p.extreme_tau)),
        "num_tokens": mask.sum().float(),
    }
    for key, stat in stats.items():
        values[key] = stat.float().sum() if key == "seq_rejected" else token_mean(stat)
    values.update(extra)
    keys = list(values)
    numbers = torch.stack([values[key].float() for key in keys]).tolist()
    return dict(zip(keys, numbers, strict=True))
