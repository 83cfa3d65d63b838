"""Resource limits for a sandboxed program, as `prlimit` arguments or as in-process rlimits."""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per-program rlimits; CPU time is a backstop behind the wall-clock timeout."""

    timeout: float
    memory_mb: int
    file_mb: int = 64
    nproc: int = 64
    nofile: int = 256

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
