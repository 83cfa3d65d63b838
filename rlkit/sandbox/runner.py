"""`run`: execute untrusted code in the sandbox, bounded in concurrency, time, memory and output.

The sandbox fails closed: the default backend is bubblewrap (`rlkit.sandbox.backends`), and when
the chosen backend cannot run programs here every run raises `SandboxUnavailable`, whose message
says how to fix it. A backend without isolation (`local`: rlimits, a temp dir and a timeout)
runs only when the user chooses it explicitly (`RLKIT_SANDBOX_BACKEND=local`, a run config's
`[sandbox] backend = "local"`, or `configure`), and every run start that resolves it logs a
warning. `RLKIT_SANDBOX_CONCURRENCY` and `RLKIT_SANDBOX_TOTAL_MEMORY_MB` override the other
defaults. The settings are one frozen `SandboxSettings`: the process's are replaced whole
(`use`, `configure`), never edited in place; a sandbox service and its sessions take their own,
passed in (`ServiceSettings.sandbox`, `PythonSession(sandbox=...)`).

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
from dataclasses import dataclass, field, replace

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


def _cpus() -> int:
    """The CPUs this process may run on (not the host's count inside a container)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class SandboxSettings:
    """The sandbox's settings as one frozen value: the backend (a registered name or
    `module:Class`, resolved and checked by `active_backend`), parallel runs, the memory cap of
    one sandbox's whole process tree, the per-stream output cap, and a sandbox service's URL and
    token file (None: in-process). Built from the environment (`from_env`) and a config's
    `[sandbox]` (`SandboxConfig.settings`); `use` makes one the process's."""

    backend: str = "bwrap"
    concurrency: int = field(default_factory=_cpus)
    total_memory_mb: int = DEFAULT_TOTAL_MEMORY_MB
    output_limit: int = 1 * MIB
    url: str | None = None
    token_file: str | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"sandbox concurrency must be >= 1, not {self.concurrency}")
        if self.total_memory_mb < 1:
            raise ValueError(f"sandbox total_memory_mb must be >= 1, not {self.total_memory_mb}")

    @classmethod
    def from_env(cls) -> SandboxSettings:
        """RLKIT_SANDBOX_BACKEND, _CONCURRENCY, _TOTAL_MEMORY_MB, _URL, _TOKEN_FILE over the
        defaults."""
        env = os.environ.get
        return cls(
            backend=env("RLKIT_SANDBOX_BACKEND", "bwrap"),
            concurrency=int(env("RLKIT_SANDBOX_CONCURRENCY", _cpus())),
            total_memory_mb=int(env("RLKIT_SANDBOX_TOTAL_MEMORY_MB", DEFAULT_TOTAL_MEMORY_MB)),
            url=env("RLKIT_SANDBOX_URL") or None,
            token_file=env("RLKIT_SANDBOX_TOKEN_FILE") or None,
        )

    def limits(self, timeout: float, memory_mb: int) -> Limits:
        """Per-run limits under these settings' total memory cap."""
        return Limits(timeout=timeout, memory_mb=memory_mb, total_memory_mb=self.total_memory_mb)


_current = SandboxSettings.from_env()
# The client of `_current`'s service, made on first use (None: none made yet, or in-process).
_service: SandboxClient | None = None
# One semaphore per event loop: asyncio primitives cannot be shared across loops.
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def use(new: SandboxSettings) -> SandboxSettings:
    """Make `new` this process's sandbox settings (what `run` and `PythonSession` read);
    returns the ones it replaces, to restore later. The backend is checked to exist."""
    global _current, _service
    backend_class(new.backend)  # ValueError: unknown, unimportable, or not a Backend
    old, _current = _current, new
    if new.concurrency != old.concurrency:
        _semaphores.clear()
    if (new.url, new.token_file) != (old.url, old.token_file):
        _service = None
    return old


def configure(
    *,
    backend: str | None = None,
    concurrency: int | None = None,
    total_memory_mb: int | None = None,
    output_limit_bytes: int | None = None,
    url: str | None = None,
    token_file: str | None = None,
) -> None:
    """`use` the current settings with these changed (None: unchanged; url "" for in-process)."""
    if url and not token_file:
        raise ValueError("a sandbox service url needs its token_file")
    now = _current
    use(
        replace(
            now,
            backend=now.backend if backend is None else backend,
            concurrency=now.concurrency if concurrency is None else concurrency,
            total_memory_mb=now.total_memory_mb if total_memory_mb is None else total_memory_mb,
            output_limit=now.output_limit if output_limit_bytes is None else output_limit_bytes,
            url=now.url if url is None else url or None,
            token_file=now.token_file if url is None else token_file or None,
        )
    )


def settings() -> SandboxSettings:
    """This process's sandbox settings."""
    return _current


def service() -> SandboxClient | None:
    """The configured sandbox service's client, or None when the sandbox runs in-process."""
    global _service
    url, token_file = _current.url, _current.token_file
    if url is None:
        return None
    if _service is None:
        if not token_file:
            raise SandboxUnavailable("RLKIT_SANDBOX_URL is set without RLKIT_SANDBOX_TOKEN_FILE")
        _service = SandboxClient(url, token_file)
    return _service


def limits(timeout: float, memory_mb: int) -> Limits:
    """Per-run limits under this process's total memory cap."""
    return _current.limits(timeout, memory_mb)


def active_backend() -> Backend:
    """This process's backend, resolved once; raise when it cannot run programs here."""
    return checked_backend(_current.backend)


@functools.cache
def checked_backend(name: str) -> Backend:
    """The backend `name`, resolved once and checked to run programs here (or raise)."""
    try:
        backend = backend_class(name)()
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
    checked_backend.cache_clear()
    return active_backend()


def _semaphore() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _semaphores:
        _semaphores[loop] = asyncio.Semaphore(_current.concurrency)
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
            return await execute(launch, stdin, timeout, _current.output_limit)
