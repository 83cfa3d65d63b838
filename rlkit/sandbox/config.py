"""`[sandbox]` in eval and train configs: the backend and memory cap, applied at run start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkit.config import Config
from rlkit.sandbox.runner import configure


class SandboxConfig(Config):
    """Overrides of the process-wide sandbox settings (unset fields keep the environment
    variables' or built-in defaults)."""

    backend: Literal["bwrap", "local"] | None = Field(
        None,
        description="bwrap (isolated, the default) or local (NO isolation, explicit opt-in); "
        "unset: RLKIT_SANDBOX_BACKEND, else bwrap.",
    )
    total_memory_mb: int | None = Field(
        None, ge=1, description="Memory cap of one sandbox's whole process tree (default 2048)."
    )

    def apply(self) -> None:
        """Configure the sandbox before the run loads its environments; those that run
        untrusted code call `rlkit.sandbox.require()` when they load."""
        configure(backend=self.backend, total_memory_mb=self.total_memory_mb)
