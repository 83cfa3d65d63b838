"""Resource limits for a sandboxed program, as `prlimit` arguments or as in-process rlimits.

Total memory of a sandbox's whole process tree is capped by accounting, not by a cgroup: each
process may map at most `memory_mb` (RLIMIT_AS) and the sandbox may hold at most
`total_memory_mb // memory_mb` processes besides bubblewrap's own init (RLIMIT_NPROC, counted
per sandbox because each sandbox has its own user namespace), so the tree can never map more
than `total_memory_mb`. Threads count as processes. A cgroup v2 memory controller would be the
tighter tool, but it is not delegated on this machine kind (`rlkit sandbox check` says so).

The sandbox's writable tmpfs mounts hold memory too, outside every process's RLIMIT_AS: each has
a fixed size (`/tmp` `TMP_MB`, `/dev/shm` `SHM_MB`, the working directory `WORKDIR_MB` beyond
the files given to it; `/dev` itself is read-only) and their sum (`scratch_mb`) comes out of
the same total, so processes and files together stay inside `total_memory_mb`.
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass

MIB = 1 << 20
# Memory cap of one sandbox's whole process tree unless configured otherwise (runner.configure).
DEFAULT_TOTAL_MEMORY_MB = 2048
# Sizes of the sandbox's writable tmpfs mounts (bubblewrap: `rlkit.sandbox.launch`).
TMP_MB = 64
SHM_MB = 64
WORKDIR_MB = 64  # beyond the request's own files
SCRATCH_MB = TMP_MB + SHM_MB + WORKDIR_MB


@dataclass(frozen=True)
class Limits:
    """Per-program rlimits; CPU time is a backstop behind the wall-clock timeout."""

    timeout: float
    memory_mb: int
    total_memory_mb: int = DEFAULT_TOTAL_MEMORY_MB
    file_mb: int = 64
    max_processes: int = 64
    nofile: int = 256

    def __post_init__(self) -> None:
        if self.memory_mb + SCRATCH_MB > self.total_memory_mb:
            raise ValueError(
                f"sandbox memory_mb ({self.memory_mb}) + its tmpfs mounts ({SCRATCH_MB} MiB) "
                f"exceed the total memory cap total_memory_mb ({self.total_memory_mb})"
            )

    @property
    def nproc(self) -> int:
        """RLIMIT_NPROC: the processes the total cap affords once the tmpfs mounts are set
        aside, plus one for bubblewrap's init (which runs no program code and maps a few
        hundred KiB)."""
        budget = (self.total_memory_mb - SCRATCH_MB) // self.memory_mb
        return min(self.max_processes, budget) + 1

    @property
    def cpu_seconds(self) -> int:
        # One second of slack so the wall-clock timeout, not SIGXCPU, usually ends a busy loop.
        return math.ceil(self.timeout) + 1

    def prlimit_args(self) -> list[str]:
        """Arguments for util-linux `prlimit` run *inside* the sandbox's user namespace.

        Applied there (not on the host-side bwrap process) because RLIMIT_NPROC counts processes
        per user namespace, so each run gets its own process budget and root is not exempt.
        """
        cpu = self.cpu_seconds
        return [
            "prlimit",
            f"--cpu={cpu}:{cpu + 1}",
            f"--as={self.memory_mb * MIB}",
            f"--fsize={self.file_mb * MIB}",
            f"--nproc={self.nproc}",
            f"--nofile={self.nofile}",
            "--core=0",
            "--",
        ]

    def apply(self) -> None:
        """Set the rlimits on the current process (the local backend's preexec hook).

        RLIMIT_NPROC is left alone: on the host it counts every process of the user, so a low
        value would break unrelated work (and root ignores it anyway).
        """
        cpu = self.cpu_seconds
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_mb * MIB, self.memory_mb * MIB))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_mb * MIB, self.file_mb * MIB))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
