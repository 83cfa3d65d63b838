"""Warm pools: sandboxes started before their code is known, one pool per limits profile.

A warm sandbox is the chosen backend's launch of `loader.py` (bubblewrap and the interpreter
already started, the loader waiting on stdin); it runs exactly one request and is then killed,
so nothing one request leaves behind is seen by another. The pool is refilled in the background
after a request has been answered (`fill`: starting a sandbox costs CPU the request's program
would compete for); an empty pool starts one on demand (a cold start). A profile's limits are
the most its sandboxes allow: the loader lowers them to each request's, never raises them.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.sandbox.backends import Backend
from rlkit.sandbox.launch import Launch, as_bytes, check_relative
from rlkit.sandbox.limits import Limits
from rlkit.sandbox.process import kill_tree, spawn, supervise
from rlkit.sandbox.result import SandboxResult

LOADER_SOURCE = (Path(__file__).parent / "loader.py").read_text()
READY = b"\x00rlkit-ready\n"
# A loaded machine may take seconds to start an interpreter; waited for apart from the request.
STARTUP_TIMEOUT_S = 60.0
# The request header's format for the loader: marshal version 4 reads the same in every
# Python 3 the sandbox may run (only str, bytes, int and dict cross).
MARSHAL_VERSION = 4


@dataclass(frozen=True)
class Profile:
    """The limits a pool's sandboxes are started with (each request may ask for less)."""

    timeout: float
    memory_mb: int

    def covers(self, timeout: float, memory_mb: int) -> bool:
        return timeout <= self.timeout and memory_mb <= self.memory_mb


@dataclass
class PoolStats:
    """Counters the service's metrics route reports."""

    warm_starts: int = 0  # requests served by a sandbox that was already waiting
    cold_starts: int = 0  # requests that had to wait for a sandbox to start
    start_failures: int = 0  # sandboxes that did not come up (or died while waiting)
    start_seconds: list[float] = field(default_factory=list)  # recent sandbox start times


class WarmSandbox:
    """One started loader, waiting for its single request."""

    def __init__(
        self, proc: asyncio.subprocess.Process, launch: Launch, stack: contextlib.ExitStack
    ):
        self.proc, self.launch, self.stack = proc, launch, stack
        # processes of the sandbox's uid that are not the request's (a fork server's own)
        self.extra_processes = 0

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def run(
        self,
        code: str,
        language: str,
        stdin: str,
        files: dict[str, str | bytes],
        request: Limits,
        output_limit: int,
    ) -> SandboxResult:
        """Hand the request over, supervise it like a fresh sandbox, then discard this one."""
        end = secrets.token_hex(16)  # this request's end marker (`loader.finish`)
        start = time.monotonic()
        try:  # whatever happens from here (a bad file name too), this sandbox is discarded
            header = marshal.dumps(
                {
                    "code": code,
                    "language": language,
                    "files": {
                        str(check_relative(name)): as_bytes(content)
                        for name, content in files.items()
                    },
                    "memory_mb": request.memory_mb,
                    "cpu_seconds": request.cpu_seconds,
                    "nproc": request.nproc + self.extra_processes,
                    "end": end,
                },
                MARSHAL_VERSION,
            )
            payload = b"%d\n" % len(header) + header + stdin.encode()
            return await supervise(
                self.proc, self.launch, payload, request.timeout, output_limit, start, end
            )
        finally:
            self.discard()

    def discard(self) -> None:
        kill_tree(self.proc.pid)
        self.stack.close()


async def start_sandbox(backend: Backend, limits: Limits) -> WarmSandbox | None:
    """Start one loader in the backend and wait for its readiness line; None if it failed."""
    stack = contextlib.ExitStack()
    launch = stack.enter_context(backend.prepare(LOADER_SOURCE, "python", {}, limits))
    try:
        proc = await spawn(launch)
    except OSError:
        stack.close()
        return None
    assert proc.stdout is not None
    sandbox = WarmSandbox(proc, launch, stack)
    try:
        ready = await asyncio.wait_for(proc.stdout.readexactly(len(READY)), STARTUP_TIMEOUT_S)
    except (TimeoutError, asyncio.IncompleteReadError):
        ready = b""
    except BaseException:  # cancelled (the pool is closing): leave no process behind
        sandbox.discard()
        raise
    if ready != READY:
        sandbox.discard()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5.0)
        return None
    return sandbox


class WarmPool:
    """Up to `size` ready sandboxes of one profile, refilled in the background."""

    def __init__(self, profile: Profile, size: int, backend: Backend):
        self.profile, self.size, self.backend = profile, size, backend
        # The process budget is the most any request may get (the loader lowers it to the
        # request's, computed from the true total cap, before any request code runs).
        self.limits = Limits(profile.timeout, profile.memory_mb, profile.memory_mb * 64)
        self.ready: list[WarmSandbox] = []
        self.starting = 0
        self.stats = PoolStats()
        self._tasks: set[asyncio.Task] = set()

    def fill(self) -> None:
        """Start sandboxes until ready + starting reaches the pool's size."""
        while len(self.ready) + self.starting < self.size:
            self.starting += 1
            task = asyncio.ensure_future(self._start_into_pool())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _start_into_pool(self) -> None:
        try:
            sandbox = await self._start()
        finally:
            self.starting -= 1
        if sandbox is not None:
            self.ready.append(sandbox)

    async def _start(self) -> WarmSandbox | None:
        began = time.monotonic()
        sandbox = await start_sandbox(self.backend, self.limits)
        if sandbox is None:
            self.stats.start_failures += 1
            return None
        self.stats.start_seconds = [*self.stats.start_seconds[-99:], time.monotonic() - began]
        return sandbox

    async def take(self) -> WarmSandbox | None:
        """A ready sandbox (warm), else one started now (cold); None when none would start.
        The caller refills the pool (`fill`) once it has answered."""
        while self.ready:
            sandbox = self.ready.pop()
            if sandbox.alive:
                self.stats.warm_starts += 1
                return sandbox
            self.stats.start_failures += 1  # died while waiting (killed, or out of CPU)
            sandbox.discard()
        self.stats.cold_starts += 1
        return await self._start()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sandbox in self.ready:
            sandbox.discard()
        self.ready.clear()
