"""The policy-loss family behind one entry point, `policy_loss(name, ...)`.

Every loss is a per-token objective J (to maximise) built from three logprobs of the sampled
tokens: the current policy (`logprobs`, with grad), the trainer's policy that generated the batch
(`old_logprobs`) and what the inference engine reported for it (`inference_logprobs`). With
r = exp(logprobs - old) and the trainer/engine mismatch k = exp(old - inference):

- icepop (Ring-1T eq. 1-2): M(k) * min(r A, clip(r, 1-eps_low, 1+eps_high) A) with
  M(k) = k if alpha <= k <= beta else 0: mismatched tokens are dropped, the rest calibrated.
- grpo: PPO clip with clip-higher (eps_low != eps_high) and optional dual clip `clip_c`
  (for A < 0 the objective is at least clip_c * A).
- tis: min(k, tis_cap) * PPO clip (truncated importance sampling, weight without gradient).
- cispo (MiniMax-M1): sg(clip(r, 1-eps_low, 1+eps_high)) * A * logprobs; every token keeps
  its gradient, only the weight is clipped. eps_low=1 means no lower bound, as in the paper.
- gspo (Qwen): sequence ratio s = exp(mean_t(logprobs - old)) clipped with its own (tiny)
  range; per token s is written as sg(s) * pi/sg(pi) (GSPO-token), which with the default
  "seq-mean-token-mean" aggregation gives exactly the sequence-level GSPO gradient.
- gppo (Klear): forward value of PPO clip, but a clipped token passes gradient
  (1 +/- eps) * A instead of 0 (the clip bound is written as (1+eps) * r / sg(r)).

`seq_reject_below` (INTELLECT-3) zeroes a whole sequence when any counted token has k below it.
Zeroed tokens (IcePop mask, rejection) stay in the denominator; loss_mask 0 tokens never count.
With one optimiser step per batch pass `old_logprobs = logprobs.detach()`: r is then 1 in value
and the IcePop form reduces to INTELLECT-3's single-step async objective.

Normalising across micro-batches and ranks: by default a call divides by its own count (counted
tokens for "token-mean", sequences with at least one counted token for "seq-mean-token-mean").
For exact gradient accumulation pass `normalizer=` the count of the whole optimiser batch (same
unit); then the sum of the micro-batch losses (and their gradients) equals the full-batch loss.
A sequence must not be split across micro-batches. Data-parallel FSDP averages gradients over
ranks, so there pass `normalizer = global_count / world_size`.

Metrics (floats; means over this call's counted tokens unless noted): mismatch_kl (k3 = k - 1 -
log k, unbiased for KL(pi_infer || pi_train) since the engine sampled the tokens),
mismatch_extreme_frac (R3 eq. 3: share of tokens with max(k, 1/k) > extreme_tau), clip_frac_low /
clip_frac_high (tokens whose gradient the clip cuts; for cispo, weights clipped), ratio_mean,
icepop_masked_low_frac / icepop_masked_high_frac, dual_clip_frac (grpo with clip_c),
tis_truncated_frac, seq_rejected (a count), entropy (if given), policy_loss, ref_kl, sft_loss,
loss, and the counts num_tokens / num_sequences for weighting metrics across micro-batches.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

LossName = Literal["icepop", "grpo", "tis", "cispo", "gspo", "gppo"]
Aggregation = Literal["token-mean", "seq-mean-token-mean"]
AGGREGATIONS = ("token-mean", "seq-mean-token-mean")

# Params every loss accepts (see policy_loss) and each loss's own params with defaults.
COMMON_PARAMS: dict[str, Any] = {
    "agg": "token-mean",
    "normalizer": None,
    "segment_ids": None,
    "seq_reject_below": None,
    "extreme_tau": 2.0,
    "entropy": None,
    "ref_logprobs": None,
    "kl_coef": 0.0,
    "sft_on_correct": False,
    "sft_coef": 0.1,
}
LOSS_PARAMS: dict[str, dict[str, Any]] = {
    "icepop": {"alpha": 0.5, "beta": 5.0, "eps_low": 0.2, "eps_high": 0.28},
    "grpo": {"eps_low": 0.2, "eps_high": 0.28, "clip_c": None},
    "tis": {"eps_low": 0.2, "eps_high": 0.28, "tis_cap": 2.0},
    "cispo": {"eps_low": 1.0, "eps_high": 0.28},
    "gspo": {"eps_low": 3e-4, "eps_high": 4e-4, "agg": "seq-mean-token-mean"},
    "gppo": {"eps_low": 0.2, "eps_high": 0.28},
}


class _Sequences:
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
    sequences: _Sequences,
    agg: str,
    normalizer: float | None,
) -> Tensor:
    """Sum the counted tokens' values and divide by the token or sequence count (see module)."""
    masked = torch.where(mask, per_token, 0.0)
    if agg == "token-mean":
        count = mask.sum()
        total = masked.sum()
    else:
        tokens_per_seq = sequences.sum(mask.float())
        has_tokens = tokens_per_seq > 0
        count = has_tokens.sum()
        total = (sequences.sum(masked)[has_tokens] / tokens_per_seq[has_tokens]).sum()
    if normalizer is not None:
        return total / normalizer
    return total / count.clamp(min=1)


def _ppo_clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    return torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)


def _clip_masks(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """Tokens whose PPO gradient is cut: ratio below the band with A<0, above it with A>0."""
    ratio = ratio.detach()
    return (ratio < 1 - eps_low) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0)


def _objective(
    name: str,
    p: dict[str, Any],
    logprobs: Tensor,
    old: Tensor,
    k: Tensor,
    adv: Tensor,
    mask: Tensor,
    sequences: _Sequences,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token objective to maximise [B, T], and per-token stats averaged into metrics."""
    ratio = torch.exp(logprobs - old)
    eps_low, eps_high = p["eps_low"], p["eps_high"]
    stats: dict[str, Tensor] = {}
    if name == "icepop":
        in_band = (k >= p["alpha"]) & (k <= p["beta"])
        objective = torch.where(in_band, k, 0.0) * _ppo_clip(ratio, adv, eps_low, eps_high)
        stats["icepop_masked_low_frac"] = k < p["alpha"]
        stats["icepop_masked_high_frac"] = k > p["beta"]
    elif name == "grpo":
        objective = _ppo_clip(ratio, adv, eps_low, eps_high)
        if p["clip_c"] is not None:
            floor = p["clip_c"] * adv
            dual = (adv < 0) & (objective < floor)
            objective = torch.where(dual, floor, objective)
            stats["dual_clip_frac"] = dual
    elif name == "tis":
        objective = k.clamp(max=p["tis_cap"]) * _ppo_clip(ratio, adv, eps_low, eps_high)
        stats["tis_truncated_frac"] = k > p["tis_cap"]
    elif name == "cispo":
        weight = ratio.detach().clamp(1 - eps_low, 1 + eps_high)
        objective = weight * adv * logprobs
        stats["clip_frac_low"] = ratio.detach() < 1 - eps_low
        stats["clip_frac_high"] = ratio.detach() > 1 + eps_high
    elif name == "gspo":
        log_ratio = torch.where(mask, logprobs - old, 0.0)
        tokens = sequences.sum(mask.float()).clamp(min=1)
        seq_log_ratio = sequences.sum(log_ratio) / tokens
        ratio = torch.exp(sequences.spread(seq_log_ratio.detach()) + logprobs - logprobs.detach())
        objective = _ppo_clip(ratio, adv, eps_low, eps_high)
    elif name == "gppo":
        ratio_grad = ratio / ratio.detach()  # value 1, gradient d log pi
        bound = torch.where(
            ratio.detach() > 1 + eps_high,
            (1 + eps_high) * ratio_grad,
            torch.where(ratio.detach() < 1 - eps_low, (1 - eps_low) * ratio_grad, ratio),
        )
        objective = torch.minimum(ratio * adv, bound * adv)
    else:  # unreachable: names are validated first
        raise AssertionError(name)
    if "clip_frac_low" not in stats:
        stats["clip_frac_low"], stats["clip_frac_high"] = _clip_masks(ratio, adv, eps_low, eps_high)
    stats["ratio_mean"] = ratio.detach()
    return objective, stats


def resolve_loss_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Defaults merged with `params`, validated; errors name the loss or param (ValueError).

    Public so a trainer can check a config before the first step.
    """
    if name not in LOSS_PARAMS:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSS_PARAMS)}")
    merged = {**COMMON_PARAMS, **LOSS_PARAMS[name]}
    unknown = sorted(set(params) - set(merged))
    if unknown:
        raise ValueError(
            f"unknown param(s) {unknown} for loss {name!r}; accepted: {sorted(merged)}"
        )
    merged.update(params)
    if merged["agg"] not in AGGREGATIONS:
        raise ValueError(f"unknown agg {merged['agg']!r}; expected one of {list(AGGREGATIONS)}")
    if not 0 <= merged["eps_low"] <= 1 or merged["eps_high"] < 0:
        raise ValueError(
            f"eps_low must be in [0, 1] and eps_high >= 0, got {merged['eps_low']}, "
            f"{merged['eps_high']}"
        )
    if name == "icepop" and not 0 <= merged["alpha"] <= 1 <= merged["beta"]:
        raise ValueError(
            f"icepop needs 0 <= alpha <= 1 <= beta, got alpha={merged['alpha']}, "
            f"beta={merged['beta']}"
        )
    if name == "grpo" and merged["clip_c"] is not None and merged["clip_c"] <= 1:
        raise ValueError(f"clip_c (dual clip) must be > 1, got {merged['clip_c']}")
    if name == "tis" and merged["tis_cap"] <= 0:
        raise ValueError(f"tis_cap must be > 0, got {merged['tis_cap']}")
    if merged["normalizer"] is not None and not merged["normalizer"] > 0:
        raise ValueError(f"normalizer must be > 0, got {merged['normalizer']}")
    if merged["seq_reject_below"] is not None and not merged["seq_reject_below"] > 0:
        raise ValueError(f"seq_reject_below must be > 0, got {merged['seq_reject_below']}")
    if not merged["extreme_tau"] > 1:
        raise ValueError(f"extreme_tau must be > 1, got {merged['extreme_tau']}")
    if merged["kl_coef"] and merged["ref_logprobs"] is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the reference model's logprobs)")
    return merged


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
    sequences = _Sequences(mask.shape, segment_ids, mask.device)
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
    sequences = _Sequences(mask.shape, segment_ids, mask.device)
    return _aggregate(k3, mask, sequences, agg, normalizer)


def policy_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    inference_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise and float metrics; see the module docstring for each loss.

    Shapes: logprobs/old_logprobs/inference_logprobs/loss_mask [B, T], advantages [B] or [B, T].
    Common params: agg ("token-mean" | "seq-mean-token-mean"), normalizer (whole-batch count for
    exact micro-batch/rank accumulation), segment_ids ([B, T] ints: sequence id per token when
    several sequences are packed into one row; default one sequence per row), seq_reject_below,
    extreme_tau (2.0, for F(tau)), entropy ([B, T], reported), ref_logprobs + kl_coef (k3 KL to
    a reference), sft_on_correct + sft_coef (Klear NLL on positive-advantage sequences, 0.1).
    Loss params (defaults in LOSS_PARAMS): eps_low, eps_high; icepop alpha, beta; grpo clip_c;
    tis tis_cap. Unknown names or params raise ValueError.
    """
    p = resolve_loss_params(name, params)
    _check_shapes(
        {
            "old_logprobs": old_logprobs,
            "inference_logprobs": inference_logprobs,
            "loss_mask": loss_mask,
            "segment_ids": p["segment_ids"],
            "entropy": p["entropy"],
            "ref_logprobs": p["ref_logprobs"],
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
    sequences = _Sequences(mask.shape, p["segment_ids"], mask.device)

    k = torch.exp(old - inference)
    objective, stats = _objective(name, p, logprobs, old, k, adv, mask, sequences)
    if p["seq_reject_below"] is not None:
        rejected_seq = sequences.sum((mask & (k < p["seq_reject_below"])).float()) > 0
        objective = torch.where(sequences.spread(rejected_seq), 0.0, objective)
        stats["seq_rejected"] = rejected_seq
    pg_loss = -_aggregate(objective, mask, sequences, p["agg"], p["normalizer"])
    loss = pg_loss

    extra: dict[str, Tensor] = {"policy_loss": pg_loss.detach()}
    shared = {"agg": p["agg"], "normalizer": p["normalizer"], "segment_ids": p["segment_ids"]}
    if p["ref_logprobs"] is not None:
        ref_kl = reference_kl_loss(logprobs, p["ref_logprobs"], mask, **shared)
        loss = loss + p["kl_coef"] * ref_kl
        extra["ref_kl"] = ref_kl.detach()
    if p["sft_on_correct"]:
        sft = sft_on_correct_loss(logprobs, mask, adv, **shared)
        loss = loss + p["sft_coef"] * sft
        extra["sft_loss"] = sft.detach()
    extra["loss"] = loss.detach()
    extra["num_sequences"] = (sequences.sum(mask.float()) > 0).sum().float()
    return loss, _metrics(stats, extra, mask, old, inference, p)


def _metrics(
    stats: dict[str, Tensor],
    extra: dict[str, Tensor],
    mask: Tensor,
    old: Tensor,
    inference: Tensor,
    p: dict[str, Any],
) -> dict[str, float]:
    """Means over counted tokens (sequence counts for rejection), converted in one sync."""
    count = mask.sum().clamp(min=1)

    def token_mean(values: Tensor) -> Tensor:
        return torch.where(mask, values.float(), 0.0).sum() / count

    # k3 = k - 1 - log k with k = pi_train / pi_infer: unbiased for KL(pi_infer || pi_train)
    # because the tokens were sampled by the engine.
    delta = old - inference
    values = {
        "mismatch_kl": token_mean(torch.exp(delta) - delta - 1),
        "mismatch_extreme_frac": token_mean(delta.abs() > math.log(p["extreme_tau"])),
        "num_tokens": mask.sum().float(),
    }
    for key, stat in stats.items():
        values[key] = stat.float().sum() if key == "seq_rejected" else token_mean(stat)
    if p["entropy"] is not None:
        values["entropy"] = token_mean(p["entropy"].detach())
    values.update(extra)
    keys = list(values)
    numbers = torch.stack([values[key].float() for key in keys]).tolist()
    return dict(zip(keys, numbers, strict=True))
