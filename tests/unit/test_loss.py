"""Each loss against hand-computed values and gradients (numbers derived in the comments).

Inputs are built from the quantities the formulas use: r = exp(logprobs - old) is the policy
ratio and k = exp(old - inference) the trainer/engine mismatch, so `old = 0` and
`logprobs = log r`, `inference = -log k`. eps_low = 0.2, eps_high = 0.28 unless stated.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.trainer import loss as losses
from rlkit.trainer.config import LossConfig
from rlkit.trainer.loss import reference_kl_loss, sft_on_correct_loss
from tests.helpers.losses import named_loss


def _inputs(ratios: list[list[float]], ks: list[list[float]]) -> tuple[torch.Tensor, ...]:
    """(logprobs with grad, old, inference) giving exactly these r and k values."""
    logprobs = torch.tensor(ratios, dtype=torch.float64).log().float().requires_grad_()
    old = torch.zeros_like(logprobs)
    inference = -torch.tensor(ks, dtype=torch.float64).log().float()
    return logprobs, old, inference


def _grad(loss: torch.Tensor, logprobs: torch.Tensor) -> list[list[float]]:
    loss.backward()
    assert logprobs.grad is not None
    return logprobs.grad.tolist()


def _close(actual: object, expected: object, tol: float = 1e-5) -> None:
    torch.testing.assert_close(
        torch.tensor(actual, dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
        atol=tol,
        rtol=0,
    )


# One sequence, A = 1, 3 counted tokens and one padding token full of garbage:
#   t0: r=1.1, k=1.0  -> M=1,   min(1.1, 1.1)  = 1.1,  dJ/dlogp = M*r = 1.1
#   t1: r=1.5, k=2.5  -> M=2.5, min(1.5, 1.28) = 1.28 (clipped), J = 3.2, grad 0
#   t2: r=1.0, k=0.25 -> k < alpha=0.5: M=0, J = 0, grad 0 -- but it stays in the denominator
# token-mean J = (1.1 + 3.2 + 0) / 3 = 1.433333 (not / 2); loss = -J; grad = -[1.1, 0, 0] / 3.
ICEPOP_R = [[1.1, 1.5, 1.0, 50.0]]
ICEPOP_K = [[1.0, 2.5, 0.25, 1.0]]


def test_icepop_masks_tokens_that_stay_in_the_denominator() -> None:
    logprobs, old, inference = _inputs(ICEPOP_R, ICEPOP_K)
    inference[0, 3] = float("nan")  # padding garbage must not leak into loss or gradient
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = named_loss("icepop", logprobs, old, inference, torch.tensor([1.0]), mask)
    _close(loss.item(), -4.3 / 3)
    _close(_grad(loss, logprobs), [[-1.1 / 3, 0.0, 0.0, 0.0]])
    _close(metrics["icepop_masked_low_frac"], 1 / 3)
    _close(metrics["icepop_masked_high_frac"], 0.0)
    _close(metrics["clip_frac_high"], 1 / 3)  # t1
    _close(metrics["clip_frac_low"], 0.0)
    _close(metrics["ratio_mean"], (1.1 + 1.5 + 1.0) / 3)
    # k3 = k - 1 - log k (KL(pi_inf || pi_old) on engine samples): t0 0;
    # t1 2.5 - 1 - log 2.5 = 0.583709; t2 0.25 - 1 + log 4 = 0.636294; mean = 0.406668.
    _close(metrics["mismatch_kl"], (2.5 - 1 - math.log(2.5) + 0.25 - 1 + math.log(4)) / 3)
    # F(2): max(k, 1/k) > 2 for t1 (2.5) and t2 (4).
    _close(metrics["mismatch_extreme_frac"], 2 / 3)
    assert metrics["num_tokens"] == 3 and metrics["num_sequences"] == 1
    assert all(isinstance(v, float) for v in metrics.values())


def test_icepop_masks_above_beta() -> None:
    # k = 6 > beta = 5: the token is dropped (high), the other (k=1, r=1, A=1) gives J=1.
    logprobs, old, inference = _inputs([[1.0, 1.0]], [[6.0, 1.0]])
    loss, metrics = named_loss(
        "icepop", logprobs, old, inference, torch.tensor([1.0]), torch.ones(1, 2)
    )
    _close(loss.item(), -0.5)
    _close(_grad(loss, logprobs), [[0.0, -0.5]])
    _close(metrics["icepop_masked_high_frac"], 0.5)


def _two_sequences() -> tuple[torch.Tensor, ...]:
    # Row 0 is the IcePop example above (A=1); row 1 has 2 counted tokens, r=1, k=1, A=-0.5:
    # J = min(-0.5, -0.5) = -0.5 each, dJ/dlogp = r*A = -0.5.
    logprobs, old, inference = _inputs(
        [ICEPOP_R[0], [1.0, 1.0, 1.0, 1.0]], [ICEPOP_K[0], [1.0, 1.0, 1.0, 1.0]]
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    return logprobs, old, inference, torch.tensor([1.0, -0.5]), mask


def test_token_mean_and_seq_mean_token_mean() -> None:
    logprobs, old, inference, adv, mask = _two_sequences()
    # token-mean: (1.1 + 3.2 + 0 - 0.5 - 0.5) / 5 = 0.66
    loss, _ = named_loss("icepop", logprobs, old, inference, adv, mask)
    _close(loss.item(), -0.66)
    _close(_grad(loss, logprobs), [[-1.1 / 5, 0, 0, 0], [0.1, 0.1, 0, 0]])
    # seq-mean-token-mean: (4.3/3 + (-1.0)/2) / 2 = 0.466667;
    # grads: row 0 t0 -1.1/3/2, row 1 +0.5/2/2 = 0.125.
    logprobs.grad = None
    loss, _ = named_loss("icepop", logprobs, old, inference, adv, mask, agg="seq-mean-token-mean")
    _close(loss.item(), -(4.3 / 3 - 0.5) / 2)
    _close(_grad(loss, logprobs), [[-1.1 / 6, 0, 0, 0], [0.125, 0.125, 0, 0]])


def test_sequence_rejection_zeroes_whole_sequence_but_keeps_denominator() -> None:
    logprobs, old, inference, adv, mask = _two_sequences()
    # Row 0 has k=0.25 < 0.3 -> rejected: J = (0 + 0 + 0 - 0.5 - 0.5) / 5 = -0.2.
    loss, metrics = named_loss("icepop", logprobs, old, inference, adv, mask, seq_reject_below=0.3)
    _close(loss.item(), 0.2)
    _close(_grad(loss, logprobs), [[0, 0, 0, 0], [0.1, 0.1, 0, 0]])
    assert metrics["seq_rejected"] == 1.0
    # A threshold below every k rejects nothing.
    _, metrics = named_loss("icepop", logprobs, old, inference, adv, mask, seq_reject_below=0.1)
    assert metrics["seq_rejected"] == 0.0


# Per-token advantages A = [-1, 2, -1], r = [0.7, 1.1, 4.0], k = 1:
#   t0: r < 0.8 with A < 0 -> min(-0.7, -0.8) = -0.8 (clipped), grad 0
#   t1: min(2.2, 2.2) = 2.2, grad r*A = 2.2
#   t2: r > 1.28 but A < 0 -> min(-4, -1.28) = -4 (unclipped), grad -4
# J = (-0.8 + 2.2 - 4) / 3; loss = -J = 2.6/3; grad = -[0, 2.2, -4] / 3.
# Dual clip c=3 caps t2 at c*A = -3 with grad 0: J = (-0.8 + 2.2 - 3) / 3.
GRPO_R = [[0.7, 1.1, 4.0]]
GRPO_A = torch.tensor([[-1.0, 2.0, -1.0]])


def test_grpo_clip_higher() -> None:
    logprobs, old, inference = _inputs(GRPO_R, [[1.0, 1.0, 1.0]])
    loss, metrics = named_loss("grpo", logprobs, old, inference, GRPO_A, torch.ones(1, 3))
    _close(loss.item(), 2.6 / 3)
    _close(_grad(loss, logprobs), [[0.0, -2.2 / 3, 4 / 3]])
    _close(metrics["clip_frac_low"], 1 / 3)
    _close(metrics["clip_frac_high"], 0.0)
    assert "dual_clip_frac" not in metrics


def test_grpo_dual_clip() -> None:
    logprobs, old, inference = _inputs(GRPO_R, [[1.0, 1.0, 1.0]])
    loss, metrics = named_loss(
        "grpo", logprobs, old, inference, GRPO_A, torch.ones(1, 3), clip_c=3.0
    )
    _close(loss.item(), 1.6 / 3)
    _close(_grad(loss, logprobs), [[0.0, -2.2 / 3, 0.0]])
    _close(metrics["dual_clip_frac"], 1 / 3)


def test_tis_truncates_weight_without_gradient() -> None:
    # A=1, r = [1.0, 1.1], k = [3.0, 0.5], tis_cap 2:
    #   t0: w = min(3, 2) = 2, PPO = 1.0 -> J = 2,    grad w*r = 2
    #   t1: w = 0.5,           PPO = 1.1 -> J = 0.55, grad 0.55
    # J = 2.55 / 2; grad = -[2, 0.55] / 2.
    logprobs, old, inference = _inputs([[1.0, 1.1]], [[3.0, 0.5]])
    loss, metrics = named_loss(
        "tis", logprobs, old, inference, torch.tensor([1.0]), torch.ones(1, 2)
    )
    _close(loss.item(), -1.275)
    _close(_grad(loss, logprobs), [[-1.0, -0.275]])
    _close(metrics["tis_truncated_frac"], 0.5)


def test_cispo_clipped_weight_times_logprob() -> None:
    # A=1, r = [0.5, 1.0, 2.0], logprobs = [-1, -2, -0.5] (old = logprobs - log r).
    # eps_low=1 (no lower bound), eps_high=0.28: w = sg(clip(r)) = [0.5, 1.0, 1.28]
    # J = sum(w * A * logprobs) / 3 = (-0.5 - 2 - 0.64) / 3; grad = -w / 3.
    ratios = torch.tensor([[0.5, 1.0, 2.0]])
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logprobs.detach() - ratios.log()
    loss, metrics = named_loss(
        "cispo", logprobs, old, old.clone(), torch.tensor([1.0]), torch.ones(1, 3)
    )
    _close(loss.item(), 3.14 / 3)
    _close(_grad(loss, logprobs), [[-0.5 / 3, -1 / 3, -1.28 / 3]])
    _close(metrics["clip_frac_high"], 1 / 3)
    _close(metrics["clip_frac_low"], 0.0)


def test_gspo_sequence_ratio() -> None:
    # Row 0: log r = [0.1, 0.3] -> s = exp(0.2) = 1.2214 > 1 + 4e-4 with A = 1: clipped to
    #   1.0004, grad 0. Row 1: 3 tokens, log r = 0 -> s = 1, A = -1: J = -1, and
    #   dJ/dlogp_t = (1/G) * A * s / |y| = 1/2 * -1 * 1/3 (sequence-level GSPO).
    # Default agg seq-mean-token-mean: J = (1.0004 - 1) / 2 = 0.0002.
    logprobs, old, inference = _inputs(
        [[math.exp(0.1), math.exp(0.3), 1.0], [1.0, 1.0, 1.0]], [[1.0] * 3] * 2
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, metrics = named_loss("gspo", logprobs, old, inference, torch.tensor([1.0, -1.0]), mask)
    _close(loss.item(), -0.0002, tol=1e-6)
    _close(_grad(loss, logprobs), [[0.0, 0.0, 0.0], [1 / 6, 1 / 6, 1 / 6]])
    _close(metrics["clip_frac_high"], 2 / 5)


def test_gspo_matches_sequence_level_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=gen) * 3
    logprobs = (old + torch.randn(3, 5, generator=gen) * 2e-4).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    adv = torch.tensor([0.7, -1.2, 0.4])
    loss, _ = named_loss("gspo", logprobs, old, old, adv, mask)
    grad = torch.autograd.grad(loss, logprobs)[0]
    lengths = mask.sum(1)
    s = torch.exp(((logprobs - old) * mask).sum(1) / lengths)
    expected = -torch.minimum(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv).mean()
    expected_grad = torch.autograd.grad(expected, logprobs)[0]
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)


# Per-token A = [1, -1, 1], r = [1.5, 0.5, 1.1]; forward value is PPO's for both:
#   t0: r > 1.28, A > 0 -> value 1.28; PPO grad 0, GPPO grad (1 + eps_high) * A = 1.28
#   t1: r < 0.8,  A < 0 -> value -0.8; PPO grad 0, GPPO grad (1 - eps_low) * A = -0.8
#   t2: unclipped        -> value 1.1,  grad r*A = 1.1 for both
# J = (1.28 - 0.8 + 1.1) / 3; loss grad = -grad(J) / 3.
GPPO_R = [[1.5, 0.5, 1.1]]
GPPO_A = torch.tensor([[1.0, -1.0, 1.0]])


def test_gppo_passes_gradient_through_clipped_tokens_where_ppo_passes_zero() -> None:
    grads = {}
    for name in ("gppo", "grpo"):
        logprobs, old, inference = _inputs(GPPO_R, [[1.0] * 3])
        loss, _ = named_loss(name, logprobs, old, inference, GPPO_A, torch.ones(1, 3))
        _close(loss.item(), -1.58 / 3)
        grads[name] = _grad(loss, logprobs)
    _close(grads["gppo"], [[-1.28 / 3, 0.8 / 3, -1.1 / 3]])
    _close(grads["grpo"], [[0.0, 0.0, -1.1 / 3]])


def test_single_step_form_ratio_is_one() -> None:
    # old = logprobs.detach(): r = 1 in value, gradient A * M(k) (INTELLECT-3's form).
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    inference = logprobs.detach() - torch.tensor([[math.log(2.0), math.log(0.1)]])
    loss, metrics = named_loss(
        "icepop", logprobs, logprobs.detach(), inference, torch.tensor([2.0]), torch.ones(1, 2)
    )
    # k = [2, 0.1]: J = (2 * 1 * 2 + 0) / 2 = 2; grad = -[2*2, 0] / 2.
    _close(loss.item(), -2.0)
    _close(_grad(loss, logprobs), [[-2.0, 0.0]])
    _close(metrics["ratio_mean"], 1.0)


def test_sft_on_correct_and_reference_kl_terms() -> None:
    logprobs = torch.tensor([[-1.0, -3.0], [-2.0, -2.0]], requires_grad=True)
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -1.0])
    # NLL only on the positive-advantage row, over all 4 counted tokens: (1 + 3) / 4 = 1.
    sft = sft_on_correct_loss(logprobs, mask, adv)
    _close(sft.item(), 1.0)
    _close(_grad(sft, logprobs), [[-0.25, -0.25], [0.0, 0.0]])
    # k3 with d = ref - logprobs = [-0.5, 1]: exp(d) - d - 1 = [0.106531, 0.718282]; d/dlogp =
    # 1 - exp(d) = [0.393469, -1.718282]; both / 2 tokens.
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kl = reference_kl_loss(lp, torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2))
    _close(kl.item(), (math.exp(-0.5) - 0.5 + math.e - 2) / 2)
    _close(_grad(kl, lp), [[(1 - math.exp(-0.5)) / 2, (1 - math.e) / 2]])
    # Inside policy_loss: loss = policy part + 0.1 * sft + kl_coef * kl.
    logprobs.grad = None
    loss, metrics = named_loss(
        "grpo",
        logprobs,
        logprobs.detach(),
        logprobs.detach(),
        adv,
        mask,
        sft_on_correct=True,
        ref_logprobs=logprobs.detach() - 1.0,
        kl_coef=0.5,
    )
    # r = 1: J = (1 + 1 - 1 - 1) / 4 = 0; sft = 1; kl: d = -1 -> exp(-1) + 1 - 1 each.
    _close(metrics["policy_loss"], 0.0)
    _close(metrics["sft_loss"], 1.0)
    _close(metrics["ref_kl"], math.exp(-1))
    _close(loss.item(), 0.1 + 0.5 * math.exp(-1))


ALL_LOSSES = ["icepop", "grpo", "tis", "cispo", "gspo", "gppo"]


def _random_batch(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(6, 7, generator=gen) * 4
    logprobs = old + torch.randn(6, 7, generator=gen) * 0.3
    inference = old + torch.randn(6, 7, generator=gen) * 0.5
    adv = torch.randn(6, generator=gen)
    mask = (torch.rand(6, 7, generator=gen) > 0.3).int()
    mask[:, 0] = 1
    return logprobs, old, inference, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("name", ALL_LOSSES)
def test_micro_batches_with_normalizer_sum_to_full_batch(name: str, agg: str) -> None:
    logprobs, old, inference, adv, mask = _random_batch(1)
    extra = {"agg": agg, "seq_reject_below": 0.5, "sft_on_correct": True}
    full_lp = logprobs.clone().requires_grad_()
    full, _ = named_loss(name, full_lp, old, inference, adv, mask, **extra)
    full.backward()
    normalizer = float(mask.sum()) if agg == "token-mean" else float(mask.shape[0])
    split_lp = logprobs.clone().requires_grad_()
    total = torch.zeros(())
    for rows in (slice(0, 2), slice(2, 6)):
        part, _ = named_loss(
            name,
            split_lp[rows],
            old[rows],
            inference[rows],
            adv[rows],
            mask[rows],
            normalizer=normalizer,
            **extra,
        )
        part.backward()
        total += part.detach()
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(split_lp.grad, full_lp.grad)


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_packed_rows_with_segment_ids_equal_unpacked(name: str) -> None:
    logprobs, old, inference, adv, mask = _random_batch(2)
    extra = {"agg": "seq-mean-token-mean", "seq_reject_below": 0.5}
    lp = logprobs.clone().requires_grad_()
    unpacked, m_unpacked = named_loss(name, lp, old, inference, adv, mask, **extra)
    (grad_unpacked,) = torch.autograd.grad(unpacked, lp)
    # Pack rows (0,1), (2,3), (4,5) into 3 rows of 14 tokens with per-token advantages.
    pack = lambda t: t.reshape(3, 14)  # noqa: E731
    segments = torch.arange(6)[:, None].expand(6, 7)
    adv_tokens = adv[:, None].expand(6, 7)
    lp2 = logprobs.clone().requires_grad_()
    packed, m_packed = named_loss(
        name,
        pack(lp2),
        pack(old),
        pack(inference),
        pack(adv_tokens),
        pack(mask),
        segment_ids=pack(segments),
        **extra,
    )
    (grad_packed,) = torch.autograd.grad(packed, lp2)
    torch.testing.assert_close(packed, unpacked)
    torch.testing.assert_close(grad_packed, grad_unpacked)
    assert m_packed["seq_rejected"] == m_unpacked["seq_rejected"]
    assert m_packed["num_sequences"] == 6


def test_entropy_metric_and_empty_mask() -> None:
    logprobs, old, inference, adv, mask = _random_batch(3)
    entropy = torch.full_like(logprobs, 2.5)
    _, metrics = named_loss("icepop", logprobs, old, inference, adv, mask, entropy=entropy)
    _close(metrics["entropy"], 2.5)
    lp = logprobs.clone().requires_grad_()
    loss, metrics = named_loss("icepop", lp, old, inference, adv, torch.zeros_like(mask))
    assert loss.item() == 0.0 and metrics["num_tokens"] == 0.0
    loss.backward()
    assert lp.grad is not None and not lp.grad.any()


def test_bad_input_raises_clear_errors() -> None:
    logprobs, old, inference, adv, mask = _random_batch(4)
    with pytest.raises(ValueError, match="unknown loss 'ppo'"):
        named_loss("ppo", logprobs, old, inference, adv, mask)
    with pytest.raises(ValueError, match=r"params\.clip_c: unknown field.* \('icepop'\)"):
        named_loss("icepop", logprobs, old, inference, adv, mask, clip_c=2.0)
    with pytest.raises(ValueError, match="params.agg: Input should be"):
        named_loss("grpo", logprobs, old, inference, adv, mask, agg="mean")
    with pytest.raises(ValueError, match="inference_logprobs must have the shape"):
        named_loss("grpo", logprobs, old, inference[:, :3], adv, mask)
    with pytest.raises(ValueError, match="advantages must be"):
        named_loss("grpo", logprobs, old, inference, adv[:2], mask)
    with pytest.raises(ValueError, match=r"logprobs must be \[B, T\]"):
        named_loss("grpo", logprobs[0], old[0], inference[0], adv, mask[0])
    with pytest.raises(ValueError, match="clip_c"):
        named_loss("grpo", logprobs, old, inference, adv, mask, clip_c=0.5)
    with pytest.raises(ValueError, match="alpha"):
        named_loss("icepop", logprobs, old, inference, adv, mask, alpha=2.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        named_loss("icepop", logprobs, old, inference, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="normalizer"):
        named_loss("icepop", logprobs, old, inference, adv, mask, normalizer=0)


def test_loss_config_resolves_typed_defaults_for_config_checks() -> None:
    gspo = LossConfig(name="gspo").resolved
    assert gspo.entry.fn is losses.gspo and isinstance(gspo.params, losses.GSPOParams)
    assert gspo.params.agg == "seq-mean-token-mean" and gspo.params.eps_high == 4e-4
    icepop = LossConfig(name="icepop", params={"beta": 3.0}).resolved.params
    assert (icepop.alpha, icepop.beta, icepop.agg) == (0.5, 3.0, "token-mean")
    with pytest.raises(ValueError, match="params.eps_high"):
        LossConfig(name="grpo", params={"eps_high": -1.0})
