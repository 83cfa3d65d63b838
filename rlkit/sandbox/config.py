"""`[sandbox]` in eval and train configs: the backend and memory cap, applied at run start."""

from __future__ import annotations

from pydantic import Field, field_validator

from rlkit.config import Config
from rlkit.sandbox.backends import backend_class
from rlkit.sandbox.runner import configure


class SandboxConfig(Config):
    """Overrides of the process-wide sandbox settings (unset fields keep the environment
    variables' or built-in defaults)."""

    backend: str | None = Field(
        None,
        description="bwrap (isolated, the default), local (NO isolation, explicit opt-in), an "
        "entry point in group rlkit.sandbox_backends, or 'my_pkg.my_module:MyBackend'; "
        "unset: RLKIT_SANDBOX_BACKEND, else bwrap.",
    )
    total_memory_mb: int | None = Field(
        None, ge=1, description="Memory cap of one sandbox's whole process tree (default 2048)."
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str | None) -> str | None:
        if name is not None:
            backend_class(name)  # ValueError: unknown, unimportable, or not a Backend
        return name

    def apply(self) -> None:
        """Configure the sandbox before the run loads its environments; those that run
        untrusted code call `rlkit.sandbox.require()` when they load."""
        configure(backend=self.backend, total_memory_mb=self.total_memory_mb)
