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
import functools
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


@functools.cache
def find_allocator(name: str) -> str | None:
    """The shared library of allocator `name` that the dynamic loader finds, or None."""
    return ctypes.util.find_library(LIBRARIES[name])


def default_allocator(cuda: bool) -> str:
    """What `auto` is here: on CPU the first of `AUTO_ORDER` that is installed, else (and on
    GPU) `system`."""
    if cuda:
        return "system"
    return next((name for name in AUTO_ORDER if find_allocator(name)), "system")


def with_allocator(env: dict[str, str], allocator: Allocator, cuda: bool) -> dict[str, str]:
    """`env` for a trainer process, with `allocator` preloaded: `auto` as `default_allocator`
    says; `tcmalloc` / `jemalloc`: that one, an error naming its package if it is not
    installed; `system`: the C library's malloc."""
    preload = env.get("LD_PRELOAD", "")
    if any(name in preload for name in PRELOADED_ALLOCATORS):
        return env
    name = default_allocator(cuda) if allocator == "auto" else allocator
    if name == "system":
        return env
    library = find_allocator(name)
    if library is None:
        raise UsageError(
            f"trainer.allocator = {name!r} but its library is not installed (Debian/Ubuntu: "
            f"apt-get install {PACKAGES[name]}); or set trainer.allocator = 'auto' or 'system'"
        )
    env = {**env, "LD_PRELOAD": f"{library}:{preload}" if preload else library}
    if name == "tcmalloc":  # no report on stderr of each allocation of 1 GiB or more
        env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 62))
    return env


def loaded_allocator() -> str:
    """The allocator this process runs with: a preloaded one mapped into it, else `system`."""
    mapped = Path("/proc/self/maps").read_text()
    return next((name for name in PRELOADED_ALLOCATORS if f"lib{name}" in mapped), "system")
