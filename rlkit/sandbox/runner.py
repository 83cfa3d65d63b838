"""`run`: execute untrusted code in the sandbox, bounded in concurrency, time, memory and output.

The sandbox fails closed: the default backend is bubblewrap (`rlkit.sandbox.backends`), and when
the chosen backend cannot run programs here every run raises `SandboxUnavailable`, whose message
says how to fix it. A backend without isolation (`local`: rlimits, a temp dir and a timeout)
runs only when the user chooses it explicitly (`RLKIT_SANDBOX_BACKEND=local`, a run config's
`[sandbox] backend = "local"`, or `configure`), and every run start that resolves it logs a
warning. `RLKIT_SANDBOX_CONCURRENCY` and `RLKIT_SANDBOX_TOTAL_MEMORY_MB` override the other
defaults.

With a sandbox service configured (`configure(url=..., token_file=...)`, `[sandbox] url`, or
`RLKIT_SANDBOX_URL` + `RLKIT_SANDBOX_TOKEN_FILE`), `run` and `PythonSession` send their work to
`rlkit sandbox serve` instead (`rlkit.sandbox.client`); a run with `mounts` (host directories)
still runs here, since a service on another machine cannot see them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import weakref

from rlkit.errors import SystemRequirementError
from rlkit.progress import make_console
from rlkit.sandbox.backends import Backend, backend_class
from rlkit.sandbox.client import SandboxClient
from rlkit.sandbox.launch import Mounts
from rlkit.sandbox.limits import DEFAULT_TOTAL_MEMORY_MB, MIB, Limits
from rlkit.sandbox.process import execute
from rlkit.sandbox.result import SandboxResult

logger = logging.getLogger(__name__)


class SandboxUnavailable(SystemRequirementError):
    """The chosen backend (bubblewrap by default) cannot run programs here."""


# The backend's registered name or `module:Class` (resolved and checked by `active_backend`).
_backend_name = os.environ.get("RLKIT_SANDBOX_BACKEND", "bwrap")
_settings: dict[str, object] = {
    # Default: the CPUs this process may run on (not the host's count inside a container).
    "concurrency": int(os.environ.get("RLKIT_SANDBOX_CONCURRENCY", len(os.sched_getaffinity(0)))),
    "total_memory_mb": int(
        os.environ.get("RLKIT_SANDBOX_TOTAL_MEMORY_MB", DEFAULT_TOTAL_MEMORY_MB)
    ),
    "output_limit": 1 * MIB,
}
# The service `run` and `PythonSession` use, when one is configured (else None: in-process).
_service: SandboxClient | None = None
_service_address = (
    os.environ.get("RLKIT_SANDBOX_URL") or None,
    os.environ.get("RLKIT_SANDBOX_TOKEN_FILE") or None,
)
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
    url: str | None = None,
    token_file: str | None = None,
) -> None:
    """Change the process-wide sandbox settings (the backend: a registered name or
    `module:Class`; parallel runs; the memory cap of one sandbox's whole process tree; the
    per-stream output cap; a sandbox service's URL and token file, "" for in-process)."""
    global _backend_name, _service, _service_address
    if backend is not None:
        backend_class(backend)  # ValueError: unknown, unimportable, or not a Backend
        _backend_name = backend
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
    if url is not None:
        if url and not token_file:
            raise ValueError("a sandbox service url needs its token_file")
        _service_address = (url or None, token_file or None)
        _service = None


def settings() -> dict[str, object]:
    """The process-wide settings (concurrency, total_memory_mb, output_limit)."""
    return dict(_settings)


def service() -> SandboxClient | None:
    """The configured sandbox service's client, or None when the sandbox runs in-process."""
    global _service
    url, token_file = _service_address
    if url is None:
        return None
    if _service is None:
        if not token_file:
            raise SandboxUnavailable("RLKIT_SANDBOX_URL is set without RLKIT_SANDBOX_TOKEN_FILE")
        _service = SandboxClient(url, token_file)
    return _service


def limits(timeout: float, memory_mb: int) -> Limits:
    """Per-run limits under the process-wide total memory cap."""
    return Limits(
        timeout=timeout,
        memory_mb=memory_mb,
        total_memory_mb=int(_settings["total_memory_mb"]),  # type: ignore[arg-type]
    )


@functools.cache
def active_backend() -> Backend:
    """Resolve the configured backend once; raise when it cannot run programs here."""
    try:
        backend = backend_class(_backend_name)()
    except ValueError as exc:
        raise SandboxUnavailable(f"RLKIT_SANDBOX_BACKEND / [sandbox] backend: {exc}") from None
    if not backend.isolated:
        warn_unsafe(backend.name)
    problem = backend.problem()
    if problem is not None:
        raise SandboxUnavailable(
            f"the sandbox backend {backend.name!r} cannot run programs here: {problem}"
        )
    return backend


def warn_unsafe(name: str) -> None:
    """The loud, logged notice that the user chose to run untrusted code without isolation."""
    message = (
        f"UNSAFE: the `{name}` sandbox backend was chosen: untrusted code runs on this host "
        "with NO filesystem, network or process isolation (rlimits and timeouts at most)"
    )
    logger.warning(message)
    make_console(stderr=True).print(f"[bold red]WARNING:[/] {message}", highlight=False)


def require() -> Backend | None:
    """Called at the start of every run that will execute untrusted code (an environment's
    load, `rlkit eval`, `rlkit train`): fails early with the fix, or logs the unsafe choice.
    With a service configured, the service checked its own backend when it started (None)."""
    if service() is not None:
        return None
    return require_here()


def require_here() -> Backend:
    """For work that runs on this host even when a sandbox service is configured (an MCP stdio
    server, whose pipes this process holds): the configured backend, checked now, so that a
    host where it cannot run refuses at load rather than on every use."""
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
    cannot run programs raises SandboxUnavailable, and a failed launch is status "sandbox_error".
    `mounts` adds a writable host working directory and read-only import roots (see `Mounts`).
    """
    if timeout <= 0 or memory_mb <= 0:
        raise ValueError("sandbox timeout and memory_mb must be positive")
    remote = service() if mounts is None else None
    if remote is not None:
        return await remote.run(code, language, stdin, timeout, memory_mb, files)
    run_limits = limits(timeout, memory_mb)
    backend = active_backend()
    async with _semaphore():
        with backend.prepare(code, language, files or {}, run_limits, mounts) as launch:
            return await execute(launch, stdin, timeout, int(_settings["output_limit"]))  # type: ignore[arg-type]
