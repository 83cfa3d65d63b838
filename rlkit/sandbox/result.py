"""What one sandboxed execution produced, and how it ended."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Status = Literal["ok", "runtime_error", "timeout", "memory", "output_limit", "sandbox_error"]


class SandboxResult(BaseModel):
    """Outcome of `rlkit.sandbox.run`.

    `status` says why the program stopped; only "sandbox_error" means the infrastructure (not the
    program) failed, which callers such as reward functions must not count against the program.
    `exit_code` is the program's exit status (128 + N when killed by signal N), None when it never
    started or was killed by the sandbox for a timeout or output limit.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration: float = 0.0
