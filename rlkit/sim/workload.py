"""Completion lengths of the simulated workload: a capped lognormal or a recorded trace.

Lengths are drawn per prompt from a generator seeded by (seed, prompt draw number), so every
scheduler compared on one seed sees the same lengths for the same prompt (common random
numbers: the difference between schedulers is the scheduling, not the luck of the draw).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from rlkit.errors import UsageError
from rlkit.protocol.batch import read_batch
from rlkit.protocol.layout import RunLayout
from rlkit.sim.config import SimConfig


class Lengths:
    """Draws completion lengths (tokens) for one group; `mean()` is the expected length."""

    def __init__(self, cap: int, trace: list[int] | None = None, **lognormal: float) -> None:
        self.cap = cap
        self.trace = trace
        self.median = lognormal.get("median", 1.0)
        self.sigma = lognormal.get("sigma", 0.0)
        self.at_cap = lognormal.get("at_cap", 0.0)
        self._mean: float | None = None
        self._share_at_cap: float | None = None

    def draw(self, rng: random.Random) -> int:
        if self.trace is not None:
            return min(self.cap, self.trace[rng.randrange(len(self.trace))])
        if rng.random() < self.at_cap:
            return self.cap
        return max(1, min(self.cap, int(rng.lognormvariate(0.0, self.sigma) * self.median)))

    def _estimate(self, n: int = 50_000) -> None:
        rng = random.Random(12345)
        draws = [self.draw(rng) for _ in range(n)]
        self._mean = math.fsum(draws) / n
        self._share_at_cap = sum(d >= self.cap for d in draws) / n

    def mean(self) -> float:
        """Expected completion length (a fixed-seed estimate)."""
        if self._mean is None:
            self._estimate()
        return self._mean  # type: ignore[return-value]

    def share_at_cap(self) -> float:
        """Share of completions at the cap (a fixed-seed estimate)."""
        if self._share_at_cap is None:
            self._estimate()
        return self._share_at_cap  # type: ignore[return-value]


def read_trace(path: str) -> list[int]:
    """Completion lengths from a run directory's batches (tokens with loss mask 1 per sample)
    or a text file with one length per line."""
    p = Path(path)
    lengths: list[int] = []
    if p.is_dir():
        for batch_file in RunLayout(p).batch_files():
            lengths += [sum(s.loss_mask) for s in read_batch(batch_file).samples]
    elif p.is_file():
        for number, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    lengths.append(int(line))
                except ValueError:
                    raise UsageError(f"simulate.trace: {p} line {number} is not a length") from None
    else:
        raise UsageError(f"simulate.trace: {p} is neither a run directory nor a file")
    lengths = [n for n in lengths if n > 0]
    if not lengths:
        raise UsageError(f"simulate.trace: {p} holds no completion lengths")
    return lengths


def lengths_for(sim: SimConfig, cap: int) -> Lengths:
    if sim.lengths == "trace":
        return Lengths(cap, trace=read_trace(sim.trace))
    return Lengths(cap, median=sim.median, sigma=sim.sigma, at_cap=sim.at_cap)
