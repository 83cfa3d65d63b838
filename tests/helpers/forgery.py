"""Tensors forged against the linear checksums rlkit's tensor table held before its keyed digests
(issue 63): the plain sum and the position-weighted sum (weights 1..65521, repeating) of a
tensor's bytes read as int16. Both are linear, so changing element p by +d, p+1 by -2d and p+2
by +d (a second difference: weights w, w+1, w+2) leaves both unchanged, whatever d is. The
forger changes a tensor at several places that way: a test then shows that such tensors, which
the old table would have passed as verified, are refused."""

from __future__ import annotations

import torch

WEIGHT_MOD = 65521  # the old weighted sum's period
BOOST = 6 << 7  # added to a bf16's bits: its exponent + 6, i.e. the element x64


def linear_sums(tensor: torch.Tensor) -> tuple[int, int]:
    """The old checksum, exactly: (sum, position-weighted sum) of the bytes as int16 (uint8 for
    an odd byte count)."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    values = (raw.view(torch.int16) if raw.numel() % 2 == 0 else raw).to(torch.int64)
    weights = torch.arange(values.numel(), dtype=torch.int64) % WEIGHT_MOD + 1
    return int(values.sum()), int((values * weights).sum())


def forge(tensor: torch.Tensor, places: int = 4, delta: int = BOOST) -> torch.Tensor:
    """A copy of `tensor` (an even number of bytes) changed at `places` places spread over it,
    each time three int16 words: +delta, -2 delta, +delta (on bf16 weights: one element x64,
    the next /4096, the one after x64), so that `linear_sums` is unchanged."""
    forged = tensor.detach().clone().contiguous()
    words = forged.reshape(-1).view(torch.uint8).view(torch.int16)
    n = words.numel()
    assert n >= 3 * places, "too small a tensor to forge at that many places"
    for k in range(places):
        p = (k + 1) * n // (places + 1)
        p -= max(0, p % WEIGHT_MOD - (WEIGHT_MOD - 3))  # w, w+1, w+2 within one period
        p = min(p, n - 3)
        change = torch.tensor([delta, -2 * delta, delta], dtype=torch.int64)
        new = words[p : p + 3].to(torch.int64) + change
        assert bool((new >= -(2**15)).all() and (new < 2**15).all()), "an int16 would overflow"
        words[p : p + 3] = new.to(torch.int16)
    return forged
