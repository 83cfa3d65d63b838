"""Per-token logprobs (and entropy) of sampled tokens without full-vocabulary fp32 logits.

The naive path builds `[N, V]` fp32 logits for the whole sequence, keeps them (and a log-softmax
of the same size) for backward and materialises a third `[N, V]` gradient: at a 152k vocabulary
and 8k tokens that is ~5 GB each. `chunked_logprobs` walks the sequence in chunks of
`chunk_size` rows, keeps only the per-token log-normaliser between forward and backward and
recomputes each chunk's logits in backward, so the peak extra memory is one `[chunk_size, V]`
fp32 block. The price is one more `hidden @ weight.T` matmul. Used by RL and SFT alike.

A weight narrower than the hidden states (LoRA's frozen bf16 LM head under fp32 compute, see
`rlkit.trainer.model`) is upcast `VOCAB_BLOCK` rows at a time, so no full-precision copy of it
is ever held; the products are the same as with an upcast copy.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

Temperature = float | Tensor  # one value, or one per row of `hidden` ([N], e.g. per sample)
VOCAB_BLOCK = 16384  # rows of a narrower weight upcast at a time (64 MiB at hidden size 1,024)
ENTROPY_ROWS = 64  # rows of a chunk whose probabilities the entropy builds at a time


def _rows(temperature: Temperature, start: int, end: int) -> Temperature:
    """The temperature of rows start..end, shaped to divide [rows, V] logits."""
    if isinstance(temperature, Tensor):
        return temperature[start:end, None]
    return temperature


def _check_inputs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: Temperature,
    chunk_size: int = 1,
    vocab: int | None = None,
) -> None:
    """Shape/value errors here name the argument; deep inside a matmul they would not. `vocab`:
    the token ids' range when `weight` holds only some of the vocabulary's rows."""
    vocab = weight.shape[0] if vocab is None else vocab
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [V, H], got shape {tuple(weight.shape)}")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"hidden size mismatch: hidden is {tuple(hidden.shape)}, weight is "
            f"{tuple(weight.shape)} (expected weight [V, {hidden.shape[1]}])"
        )
    if targets.shape != (hidden.shape[0],):
        raise ValueError(
            f"targets must be [N] = [{hidden.shape[0]}], got shape {tuple(targets.shape)}"
        )
    if targets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"targets must be integer token ids, got dtype {targets.dtype}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(
            f"targets must be token ids in [0, {vocab}), got range "
            f"[{int(targets.min())}, {int(targets.max())}] (mask padding with a valid id)"
        )
    if isinstance(temperature, Tensor):
        if temperature.shape != (hidden.shape[0],):
            raise ValueError(
                f"temperature must be a float or [N] = [{hidden.shape[0]}], "
                f"got shape {tuple(temperature.shape)}"
            )
        if temperature.numel() and not bool((temperature > 0).all()):
            raise ValueError("temperature must be > 0 everywhere")
    elif not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _upcast_blocks(weight: Tensor, dtype: torch.dtype) -> Iterator[tuple[int, Tensor]]:
    """(first row, rows in `dtype`) of a narrower `weight`, `VOCAB_BLOCK` rows at a time, so it
    is never held upcast whole (callers take a weight already in `dtype` whole)."""
    for start in range(0, weight.shape[0], VOCAB_BLOCK):
        yield start, weight[start : start + VOCAB_BLOCK].to(dtype)


def _fp32_logits(hidden: Tensor, weight: Tensor, temperature: Temperature) -> Tensor:
    """fp32 logits (of one chunk); the matmul runs in the hidden states' dtype like an LM head."""
    if weight.dtype == hidden.dtype:
        logits = (hidden @ weight.T).float()
    else:
        logits = hidden.new_empty((hidden.shape[0], weight.shape[0]), dtype=torch.float32)
        for start, block in _upcast_blocks(weight, hidden.dtype):
            logits[:, start : start + block.shape[0]] = hidden @ block.T
    if isinstance(temperature, Tensor) or temperature != 1.0:
        logits.div_(temperature)
    return logits


def _times_weight(grad_logits: Tensor, weight: Tensor, dtype: torch.dtype) -> Tensor:
    """grad_logits [n, V] @ weight [V, H] in `dtype` (the hidden states' gradient)."""
    if weight.dtype == dtype:
        return (grad_logits.to(weight.dtype) @ weight).to(dtype)
    out = torch.zeros(grad_logits.shape[0], weight.shape[1], dtype=dtype, device=weight.device)
    for start, block in _upcast_blocks(weight, dtype):
        out.addmm_(grad_logits[:, start : start + block.shape[0]].to(dtype), block)
    return out


def _entropy(logits: Tensor, lse: Tensor) -> Tensor:
    """H = lse - sum(p * logits) per row, `ENTROPY_ROWS` rows at a time: the probabilities
    are a small block, not a second [chunk_size, V] one beside the logits."""
    entropy = torch.empty_like(lse)
    for start in range(0, logits.shape[0], ENTROPY_ROWS):
        rows, row_lse = logits[start : start + ENTROPY_ROWS], lse[start : start + ENTROPY_ROWS]
        weighted = rows.sub(row_lse[:, None]).exp_().mul_(rows).sum(-1)
        entropy[start : start + ENTROPY_ROWS] = row_lse - weighted
    return entropy


class _ChunkedLogprobs(torch.autograd.Function):
    """Autograd function: forward and backward both loop over row chunks of `hidden`."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk_size: int,
        temperature: Temperature,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        log_norm = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            logits = _fp32_logits(hidden[start:end], weight, _rows(temperature, start, end))
            lse = torch.logsumexp(logits, dim=-1)
            log_norm[start:end] = lse
            logprobs[start:end] = logits.gather(1, targets[start:end, None]).squeeze(1) - lse
            if with_entropy:
                entropy[start:end] = _entropy(logits, lse)
            del logits
        ctx.save_for_backward(hidden, weight, targets, log_norm)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_logprobs: Tensor, _grad_entropy: Tensor
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, targets, log_norm = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Accumulate in fp32 across chunks so bf16 weights do not lose precision per chunk; a
        # frozen weight (LoRA) gets none: [V, H] fp32 zeros the size of the whole LM head.
        grad_weight = None
        if need_weight:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_logprobs = grad_logprobs.float()
        n, step = hidden.shape[0], ctx.chunk_size
        for start in range(0, n, step):
            end = min(start + step, n)
            g = grad_logprobs[start:end]
            temp = _rows(ctx.temperature, start, end)
            logits = _fp32_logits(hidden[start:end], weight, temp)
            # d logprob / d logits = onehot(target) - softmax; built in place in the logits buffer.
            grad_logits = logits.sub_(log_norm[start:end, None]).exp_().mul_(-g[:, None])
            grad_logits.scatter_add_(1, targets[start:end, None], g[:, None])
            if isinstance(temp, Tensor) or temp != 1.0:
                grad_logits.div_(temp)
            if grad_hidden is not None:
                grad_hidden[start:end] = _times_weight(grad_logits, weight, hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.T, hidden[start:end].float())
            del logits, grad_logits
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_size: int = 1024,
    temperature: Temperature = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probabilities of `targets` under logits `hidden @ weight.T / temperature`.

    `temperature` is one float or one value per row ([N]: each sample's sampling temperature).

    hidden [N, H] (final hidden states), weight [V, H] (LM head), targets [N] (the next tokens).
    Returns fp32 (logprobs [N], entropy [N] or None). Gradients flow to hidden and weight and
    match `naive_logprobs` within fp32 tolerance; entropy is a diagnostic and has no gradient.
    Peak extra memory is one [chunk_size, V] fp32 block instead of several [N, V] ones.
    """
    _check_inputs(hidden, weight, targets, temperature, chunk_size)
    logprobs, entropy = _ChunkedLogprobs.apply(
        hidden, weight, targets, chunk_size, temperature, with_entropy
    )
    return logprobs, entropy if with_entropy else None


def naive_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: Temperature = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Reference implementation: full [N, V] fp32 logits and log-softmax (tests, benchmarks)."""
    _check_inputs(hidden, weight, targets, temperature)
    log_probs_all = torch.log_softmax(
        _fp32_logits(hidden, weight, _rows(temperature, 0, hidden.shape[0])), dim=-1
    )
    logprobs = log_probs_all.gather(1, targets[:, None]).squeeze(1)
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1)
    return logprobs, entropy
