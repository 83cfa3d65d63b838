"""`run`: execute untrusted code in the sandbox, bounded in concurrency, time, memory and output.

The backend is bubblewrap whenever it works on this machine (checked once by a self-test); the
`local` backend (rlimits, a temp dir and a timeout, no isolation) is used only when bubblewrap is
missing or broken, and says so loudly. `RLKIT_SANDBOX_BACKEND` (auto|bwrap|local) and
`RLKIT_SANDBOX_CONCURRENCY` override the defaults; so does `configure`.
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

from rlkit.sandbox.launch import prepare_bwrap, prepare_local
from rlkit.sandbox.limits import MIB, Limits
from rlkit.sandbox.process import execute
from rlkit.sandbox.result import SandboxResult

Backend = Literal["bwrap", "local"]
logger = logging.getLogger(__name__)

_settings: dict[str, object] = {
    "backend": os.environ.get("RLKIT_SANDBOX_BACKEND", "auto"),
    # Default: the CPUs this process may run on (not the host's count inside a container).
    "concurrency": int(os.environ.get("RLKIT_SANDBOX_CONCURRENCY", len(os.sched_getaffinity(0)))),
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
    output_limit_bytes: int | None = None,
) -> None:
    """Change the process-wide sandbox settings (backend auto|bwrap|local, parallel runs, the
    per-stream output cap)."""
    if backend is not None:
        if backend not in ("auto", "bwrap", "local"):
            raise ValueError(f"sandbox backend must be auto, bwrap or local, not {backend!r}")
        _settings["backend"] = backend
        active_backend.cache_clear()
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError(f"sandbox concurrency must be >= 1, not {concurrency}")
        _settings["concurrency"] = concurrency
        _semaphores.clear()
    if output_limit_bytes is not None:
        _settings["output_limit"] = output_limit_bytes


@functools.cache
def bwrap_self_test() -> str | None:
    """None when bubblewrap can run the sandbox here, else the reason it cannot."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian package `bubblewrap`)"
    if shutil.which("prlimit") is None or shutil.which("setpriv") is None:
        return "prlimit/setpriv are not installed (util-linux)"
    limits = Limits(timeout=20, memory_mb=256)
    with prepare_bwrap("print('sandbox-ok')", "python", {}, limits) as launch:
        try:
            proc = subprocess.run(
                launch.argv,
                pass_fds=launch.pass_fds,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap self-test failed: {exc}"
    if proc.returncode != 0 or proc.stdout.strip() != "sandbox-ok":
        return f"bwrap self-test failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return None


@functools.cache
def active_backend() -> Backend:
    """Resolve the configured backend once; warn loudly whenever isolation is off."""
    wanted = _settings["backend"]
    if wanted == "local":
        _warn_unsafe("the local sandbox backend was requested")
        return "local"
    problem = bwrap_self_test()
    if problem is None:
        return "bwrap"
    if wanted == "bwrap":
        raise RuntimeError(f"sandbox backend bwrap requested but unusable: {problem}")
    _warn_unsafe(problem)
    return "local"


def _warn_unsafe(reason: str) -> None:
    message = (
        f"UNSAFE: {reason}; untrusted code runs with the `local` sandbox backend "
        "(rlimits and timeouts only, NO filesystem/network/process isolation)"
    )
    logger.warning(message)
    Console(stderr=True).print(f"[bold red]WARNING:[/] {message}", highlight=False)


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
) -> SandboxResult:
    """Run `code` (a whole program) in a fresh sandbox and report how it ended.

    Never raises for anything the program does; bad arguments raise ValueError, and a broken
    sandbox shows up as status "sandbox_error".
    """
    if timeout <= 0 or memory_mb <= 0:
        raise ValueError("sandbox timeout and memory_mb must be positive")
    limits = Limits(timeout=timeout, memory_mb=memory_mb)
    prepare = prepare_bwrap if active_backend() == "bwrap" else prepare_local
    async with _semaphore():
        with prepare(code, language, files or {}, limits) as launch:
            return await execute(launch, stdin, timeout, int(_settings["output_limit"]))  # type: ignore[arg-type]
