"""Untrusted-code execution: bubblewrap isolation, rlimits, wall-clock timeouts, capped output.

`await run(code, language="python", stdin="", timeout=10.0, memory_mb=512, files=None)` runs one
program in a fresh sandbox; `PythonSession` keeps one sandboxed interpreter alive across cells
(the Python tool of tool environments). Both start programs through the chosen `Backend`
(`rlkit.sandbox.backends`: bwrap by default, local only by explicit choice, or the user's own).
"""

from rlkit.sandbox.backends import BACKENDS, Backend
from rlkit.sandbox.result import SandboxResult, Status
from rlkit.sandbox.runner import SandboxUnavailable, active_backend, configure, require, run
from rlkit.sandbox.session import CellResult, PythonSession

__all__ = [
    "BACKENDS",
    "Backend",
    "CellResult",
    "PythonSession",
    "SandboxResult",
    "SandboxUnavailable",
    "Status",
    "active_backend",
    "configure",
    "require",
    "run",
]
