"""Tolerances derived from the computation compared, not from the machine that first ran it.

Two float computations of one sum may add its terms in different orders (another kernel,
another vector width: AVX2 against AVX-512, a chunked loss against a whole one). Each addition
rounds by at most half an ulp of the running sum, so two orders differ by at most about
`n_terms * eps * max|term|` (the classic bound for recursive summation, both sides counted).
"""

from __future__ import annotations

import torch


def summation_atol(n_terms: int, max_term: float, dtype: torch.dtype = torch.float32) -> float:
    """How far two summation orders of `n_terms` terms of at most `max_term` in magnitude may
    land apart in `dtype`."""
    return n_terms * torch.finfo(dtype).eps * max_term


def forward_terms(config: object, keys: int) -> int:
    """The additions on the longest path from the inputs to one token's logprob in a decoder
    with `config`'s shapes (a transformers config): per layer, attention over `keys` keys and
    the hidden and intermediate projections; the head's hidden; the log-softmax's vocabulary."""
    hidden = int(config.hidden_size)  # type: ignore[attr-defined]
    mlp = int(getattr(config, "moe_intermediate_size", None) or config.intermediate_size)  # type: ignore[attr-defined]
    per_layer = keys + 4 * hidden + mlp  # q, k, v, o projections; attention; the MLP's down
    return int(config.num_hidden_layers) * per_layer + hidden + int(config.vocab_size)  # type: ignore[attr-defined]
