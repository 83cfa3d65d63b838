"""Random trainer sequences for packing and routing tests."""

from __future__ import annotations

import torch

from rlkit.trainer.packing import TokenSequence


def sequences(vocab: int, lengths: list[int], seed: int = 0) -> list[TokenSequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        prompt = max(1, n // 3)
        out.append(TokenSequence(ids, [0] * prompt + [1] * (n - prompt), [0.0] * n, 1.0))
    return out
