"""chunked_logprobs equals the naive full-logits version in value, entropy and gradients."""

from __future__ import annotations

import pytest
import torch

from rlkit.trainer import logprobs as logprobs_module
from rlkit.trainer.logprobs import chunked_logprobs, naive_logprobs


def _inputs(
    n: int = 37, h: int = 16, v: int = 50, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=gen).to(dtype)
    weight = (torch.randn(v, h, generator=gen) * 0.5).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk_size", [1, 8, 37, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7, "per-row"])
def test_chunked_matches_naive_values_entropy_and_grads(
    chunk_size: int, temperature: float | str
) -> None:
    hidden, weight, targets = _inputs()
    upstream = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(1))
    if temperature == "per-row":  # each sample of a batch keeps its own sampling temperature
        temperature = torch.tensor([0.6, 1.0, 1.3])[torch.arange(hidden.shape[0]) % 3]
    results = []
    for fn, kwargs in ((naive_logprobs, {}), (chunked_logprobs, {"chunk_size": chunk_size})):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logprobs, entropy = fn(h, w, targets, temperature=temperature, with_entropy=True, **kwargs)
        (logprobs * upstream).sum().backward()
        results.append((logprobs.detach(), entropy, h.grad, w.grad))
    (lp_n, ent_n, gh_n, gw_n), (lp_c, ent_c, gh_c, gw_c) = results
    torch.testing.assert_close(lp_c, lp_n)
    torch.testing.assert_close(ent_c, ent_n)
    torch.testing.assert_close(gh_c, gh_n)
    torch.testing.assert_close(gw_c, gw_n)
    assert lp_c.dtype == torch.float32 and not ent_c.requires_grad


def test_per_row_temperature_equals_scaling_each_row() -> None:
    hidden, weight, targets = _inputs()
    temps = torch.linspace(0.5, 1.5, hidden.shape[0])
    together, _ = chunked_logprobs(hidden, weight, targets, chunk_size=8, temperature=temps)
    for i in (0, 10, 36):
        alone, _ = naive_logprobs(hidden[i : i + 1], weight, targets[i : i + 1], float(temps[i]))
        torch.testing.assert_close(together[i : i + 1], alone)


def test_logprobs_are_log_softmax_of_targets() -> None:
    # Two tokens, V=3, H=1, weight = [[0], [1], [2]]: logits = h * [0, 1, 2].
    hidden = torch.tensor([[0.0], [1.0]])
    weight = torch.tensor([[0.0], [1.0], [2.0]])
    logprobs, entropy = chunked_logprobs(hidden, weight, torch.tensor([0, 2]), with_entropy=True)
    # h=0: uniform -> log(1/3), entropy log 3. h=1: 2 - logsumexp(0, 1, 2) = -0.407606.
    expected = [-torch.log(torch.tensor(3.0)).item(), 2 - torch.logsumexp(weight[:, 0], 0).item()]
    assert logprobs.tolist() == pytest.approx(expected, abs=1e-6)
    assert entropy is not None
    assert entropy[0].item() == pytest.approx(torch.log(torch.tensor(3.0)).item(), abs=1e-6)


def test_frozen_weight_and_no_entropy() -> None:
    hidden, weight, targets = _inputs()
    h = hidden.clone().requires_grad_()
    logprobs, entropy = chunked_logprobs(h, weight, targets, chunk_size=5)
    assert entropy is None
    logprobs.sum().backward()
    h_ref = hidden.clone().requires_grad_()
    naive_logprobs(h_ref, weight, targets)[0].sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad)


def test_a_narrower_frozen_weight_gives_its_upcast_copy_s_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LoRA's frozen bf16 LM head under fp32 compute: upcast a block of vocabulary rows at a
    time (7 of 50 here), the same logprobs, entropy and hidden gradient as an fp32 copy."""
    monkeypatch.setattr(logprobs_module, "VOCAB_BLOCK", 7)
    monkeypatch.setattr(logprobs_module, "ENTROPY_ROWS", 4)
    hidden, weight, targets = _inputs()
    narrow = weight.to(torch.bfloat16)
    results = []
    for w in (narrow, narrow.float()):
        h = hidden.clone().requires_grad_()
        lp, ent = chunked_logprobs(h, w, targets, chunk_size=16, temperature=0.7, with_entropy=True)
        lp.sum().backward()
        results.append((lp.detach(), ent, h.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


def test_bf16_parameters_within_bf16_tolerance() -> None:
    hidden, weight, targets = _inputs(dtype=torch.bfloat16)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logprobs, _ = chunked_logprobs(h, w, targets, chunk_size=8)
    logprobs.sum().backward()
    h_ref, w_ref = hidden.float().requires_grad_(), weight.float().requires_grad_()
    ref, _ = naive_logprobs(h_ref, w_ref, targets)
    ref.sum().backward()
    assert logprobs.dtype == torch.float32
    assert h.grad is not None and h.grad.dtype == torch.bfloat16
    assert w.grad is not None and w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logprobs, ref, atol=0.05, rtol=0.02)
    torch.testing.assert_close(h.grad.float(), h_ref.grad, atol=0.05, rtol=0.02)
    torch.testing.assert_close(w.grad.float(), w_ref.grad, atol=0.05, rtol=0.02)


def test_malformed_inputs_raise_clear_errors() -> None:
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\]"):
        chunked_logprobs(hidden[None], weight, targets)
    with pytest.raises(ValueError, match="hidden size mismatch"):
        chunked_logprobs(hidden, weight[:, :8], targets)
    with pytest.raises(ValueError, match=r"targets must be \[N\] = \[37\]"):
        chunked_logprobs(hidden, weight, targets[:5])
    with pytest.raises(ValueError, match=r"token ids in \[0, 50\)"):
        chunked_logprobs(hidden, weight, torch.full_like(targets, -100))
    with pytest.raises(ValueError, match="integer token ids"):
        chunked_logprobs(hidden, weight, targets.float())
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(hidden, weight, targets, temperature=0.0)
