"""The plain-copy baseline weight benchmarks divide by: every tensor copied into a preallocated
one of its shape and dtype (the bytes read once and written once)."""

from __future__ import annotations

import statistics
import time

import torch


def raw_copy_s(tensors: list[tuple[str, torch.Tensor]], targets: dict[str, torch.Tensor]) -> float:
    t0 = time.perf_counter()
    for name, tensor in tensors:
        targets[name].copy_(tensor)
    return time.perf_counter() - t0


def copies_s(tensors, targets: dict[str, torch.Tensor], rounds: int = 1) -> dict[int, list[float]]:
    """Seconds of `rounds` raw copies with torch's own thread count and with one thread (on a
    shared 2-core machine OpenMP's threads made the copy several times slower)."""
    threads = torch.get_num_threads()
    times: dict[int, list[float]] = {}
    for n in sorted({threads, 1}):
        torch.set_num_threads(n)
        times[n] = [raw_copy_s(tensors, targets) for _ in range(rounds)]
    torch.set_num_threads(threads)
    return times


def plain_copy_s(tensors, targets: dict[str, torch.Tensor], repeats: int) -> float:
    """The raw copy's median seconds over `repeats` (after one to warm up), the faster of the
    two thread counts (`copies_s`)."""
    times = copies_s(tensors, targets, repeats + 1)
    return min(statistics.median(ts[1:]) for ts in times.values())
