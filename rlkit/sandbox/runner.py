"""`run`: execute untrusted code in the sandbox, bounded in concurrency, time, memory and output.

The sandbox fails closed: the backend is bubblewrap, and when bubblewrap is missing or broken
every run raises `SandboxUnavailable`, whose message says how to install it. The `local`
backend (rlimits, a temp dir and a timeout, NO isolation) runs only when the user chooses it
explicitly (`RLKIT_SANDBOX_BACKEND=local`, a run config's `[sandbox] backend = "local"`, or
`configure`), and every run start that resolves it logs a warning.
`RLKIT_SANDBOX_CONCURRENCY` and `RLKIT_SANDBOX_TOTAL_MEMORY_MB` override the other defaults.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import subprocess
import weakref
from typing import Literal

from rich.console import Console

from rlkit.errors import SystemRequirementError
from rlkit.sandbox.launch import Mounts, prepare_bwrap, prepare_local
from rlkit.sandbox.limits import DEFAULT_TOTAL_MEMORY_MB, MIB, Limits
from rlkit.sandbox.process import execute
from rlkit.sandbox.result import SandboxResult

Backend = Literal["bwrap", "local"]
BACKENDS = ("bwrap", "local")
INSTALL_HINT = (
    "install bubblewrap and util-linux (Debian/Ubuntu: `apt-get install bubblewrap util-linux`; "
    "in a container, allow unprivileged user namespaces), then check with `rlkit sandbox check`. "
    "To run untrusted code WITHOUT isolation instead, choose it explicitly: "
    "RLKIT_SANDBOX_BACKEND=local"
)
logger = logging.getLogger(__name__)


class SandboxUnavailable(SystemRequirementError):
    """Bubblewrap cannot isolate programs here and the local backend was not chosen."""


_settings: dict[str, object] = {
    "backend": os.environ.get("RLKIT_SANDBOX_BACKEND", "bwrap"),
    # Default: the CPUs this process may run on (not the host's count inside a container).
    "concurrency": int(os.environ.get("RLKIT_SANDBOX_CONCURRENCY", len(os.sched_getaffinity(0)))),
    "total_memory_mb": int(
        os.environ.get("RLKIT_SANDBOX_TOTAL_MEMORY_MB", DEFAULT_TOTAL_MEMORY_MB)
    ),
    "output_limit": 1 * MIB,
}
# One semaphore per event loop: asyncio primitives cannot be shared across loops.
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def configure(
    *,
    backend: str | None = None,
    concurrency: int | None = None,
    total_memory_mb: int | None = None,
    output_limit_bytes: int | None = None,
) -> None:
    """Change the process-wide sandbox settings (backend bwrap|local, parallel runs, the memory
    cap of one sandbox's whole process tree, the per-stream output cap)."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"sandbox backend must be one of {BACKENDS}, not {backend!r}")
        _settings["backend"] = backend
        active_backend.cache_clear()
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError(f"sandbox concurrency must be >= 1, not {concurrency}")
        _settings["concurrency"] = concurrency
        _semaphores.clear()
    if total_memory_mb is not None:
        if total_memory_mb < 1:
            raise ValueError(f"sandbox total_memory_mb must be >= 1, not {total_memory_mb}")
        _settings["total_memory_mb"] = total_memory_mb
    if output_limit_bytes is not None:
        _settings["output_limit"] = output_limit_bytes


def limits(timeout: float, memory_mb: int) -> Limits:
    """Per-run limits under the process-wide total memory cap."""
    return Limits(
        timeout=timeout,
        memory_mb=memory_mb,
        total_memory_mb=int(_settings["total_memory_mb"]),  # type: ignore[arg-type]
    )


@functools.cache
def bwrap_self_test() -> str | None:
    """None when bubblewrap can run the sandbox here, else the reason it cannot."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian package `bubblewrap`)"
    if shutil.which("prlimit") is None or shutil.which("setpriv") is None:
        return "prlimit/setpriv are not installed (Debian package `util-linux`)"
    try:
        with prepare_bwrap("print('sandbox-ok')", "python", {}, limits(20, 256)) as launch:
            proc = subprocess.run(
                launch.argv,
                pass_fds=launch.pass_fds,
                capture_output=True,
                text=True,
                timeout=30,
            )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"bwrap self-test failed: {exc}"
    if proc.returncode != 0 or proc.stdout.strip() != "sandbox-ok":
        return f"bwrap self-test failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return None


@functools.cache
def active_backend() -> Backend:
    """Resolve the configured backend once; raise when isolation is unavailable."""
    wanted = _settings["backend"]
    if wanted not in BACKENDS:
        raise SandboxUnavailable(f"RLKIT_SANDBOX_BACKEND must be one of {BACKENDS}, not {wanted!r}")
    if wanted == "local":
        warn_unsafe()
        return "local"
    problem = bwrap_self_test()
    if problem is not None:
        raise SandboxUnavailable(f"the sandbox cannot isolate programs: {problem}; {INSTALL_HINT}")
    return "bwrap"


def warn_unsafe() -> None:
    """The loud, logged notice that the user chose to run untrusted code without isolation."""
    message = (
        "UNSAFE: the `local` sandbox backend was chosen: untrusted code runs on this host with "
        "rlimits and timeouts only (NO filesystem, network or process isolation)"
    )
    logger.warning(message)
    Console(stderr=True).print(f"[bold red]WARNING:[/] {message}", highlight=False)


def require() -> Backend:
    """Called at the start of every run that will execute untrusted code (an environment's
    load, `rlkit eval`, `rlkit train`): fails early with the fix, or logs the unsafe choice."""
    active_backend.cache_clear()
    return active_backend()


def _semaphore() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _semaphores:
        _semaphores[loop] = asyncio.Semaphore(int(_settings["concurrency"]))  # type: ignore[arg-type]
    return _semaphores[loop]


async def run(
    code: str,
    *,
    language: str = "python",
    stdin: str = "",
    timeout: float = 10.0,
    memory_mb: int = 512,
    files: dict[str, str | bytes] | None = None,
    mounts: Mounts | None = None,
) -> SandboxResult:
    """Run `code` (a whole program) in a fresh sandbox and report how it ended.

    Never raises for anything the program does; bad arguments raise ValueError, a sandbox that
    cannot isolate raises SandboxUnavailable, and a failed launch is status "sandbox_error".
    `mounts` adds a writable host working directory and read-only import roots (see `Mounts`).
    """
    if timeout <= 0 or memory_mb <= 0:
        raise ValueError("sandbox timeout and memory_mb must be positive")
    run_limits = limits(timeout, memory_mb)
    prepare = prepare_bwrap if active_backend() == "bwrap" else prepare_local
    async with _semaphore():
        with prepare(code, language, files or {}, run_limits, mounts) as launch:
            return await execute(launch, stdin, timeout, int(_settings["output_limit"]))  # type: ignore[arg-type]
