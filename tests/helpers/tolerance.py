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
