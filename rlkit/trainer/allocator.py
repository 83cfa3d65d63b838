"""The trainer process's memory allocator: tcmalloc or jemalloc where one is installed.

glibc's malloc keeps the blocks a training step frees in its heaps (it raises its mmap
threshold to the largest block freed, up to 32 MiB, and FSDP2's per-layer gathers and the
activations are blocks of that size), so the trainer's resident set grows by several bytes per
parameter after the first step. tcmalloc and jemalloc reuse or return them: a lower peak per
parameter; tcmalloc also takes less time a step, jemalloc gives the lowest peak
(`tests/benchmarks/bench_train_memory.py --variants glibc,tcmalloc,jemalloc`; figures in
docs/benchmarks.md). `auto` prefers tcmalloc, as PyTorch's CPU launcher
(`torch.backends.xeon.run_cpu`) and vLLM's CPU backend do, on a CPU trainer only: on a GPU the
trainer's host memory is small beside the device's, and no allocator was measured there.

An allocator must be chosen before a process starts, so whoever starts a trainer process (the
launcher of `rlkit train`, `rlkit sft`) puts it in that process's `LD_PRELOAD` with
`with_allocator`. An allocator the user already preloads is left alone.
"""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path
from typing import Literal

from rlkit.errors import UsageError

Allocator = Literal["auto", "tcmalloc", "jemalloc", "system"]
# each allocator's library (as the dynamic loader names it) and its Debian/Ubuntu package
LIBRARIES = {"tcmalloc": "tcmalloc_minimal", "jemalloc": "jemalloc"}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}
AUTO_ORDER = ("tcmalloc", "jemalloc")
# allocators a user may preload themselves (then theirs is kept)
PRELOADED_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")


def find_allocator(name: str) -> str | None:
    """The shared library of allocator `name` that the dynamic loader finds, or None."""
    return ctypes.util.find_library(LIBRARIES[name])


def with_allocator(env: dict[str, str], allocator: Allocator, cuda: bool) -> dict[str, str]:
    """`env` for a trainer process, with `allocator` preloaded.

    `auto`: on CPU (`cuda` False) the first of tcmalloc and jemalloc that is installed, else (and
    on GPU) the system's malloc; `tcmalloc` / `jemalloc`: that one, an error naming its package
    if it is not installed; `system`: the C library's malloc.
    """
    preload = env.get("LD_PRELOAD", "")
    if allocator == "system" or any(name in preload for name in PRELOADED_ALLOCATORS):
        return env
    if allocator == "auto" and cuda:
        return env
    for name in AUTO_ORDER if allocator == "auto" else (allocator,):
        library = find_allocator(name)
        if library is not None:
            env = {**env, "LD_PRELOAD": f"{library}:{preload}" if preload else library}
            if name == "tcmalloc":  # no report on stderr of each allocation of 1 GiB or more
                env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 62))
            return env
    if allocator == "auto":
        return env
    raise UsageError(
        f"trainer.allocator = {allocator!r} but its library is not installed (Debian/Ubuntu: "
        f"apt-get install {PACKAGES[allocator]}); or set trainer.allocator = 'auto' or 'system'"
    )


def loaded_allocator() -> str:
    """The allocator this process runs with: a preloaded one mapped into it, else `system`."""
    maps = Path(f"/proc/{os.getpid()}/maps")
    mapped = maps.read_text() if maps.exists() else ""
    for name in PRELOADED_ALLOCATORS:
        if f"lib{name}" in mapped:
            return name
    return "system"
