"""A persistent sandboxed Python interpreter: state survives across cells (a notebook for tools).

One `python3` in the chosen sandbox backend (`rlkit.sandbox.backends`; bubblewrap by default)
runs `repl_server.py` for the session's lifetime; cells go over stdin as JSON lines and answers
come back the same way. A cell that exceeds its wall-clock timeout or crashes the interpreter
kills the whole sandbox; the next cell starts a fresh one (its state is gone, and the result
says so). With a sandbox service configured the interpreter lives on the service
(`RemoteSession`), with the same results; a service that fails answers "sandbox_error".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlkit.sandbox.client import ServiceError
from rlkit.sandbox.launch import Launch
from rlkit.sandbox.process import classify, kill_tree, spawn
from rlkit.sandbox.result import Status
from rlkit.sandbox.runner import (
    SandboxSettings,
    active_backend,
    checked_backend,
    service,
    settings,
)
from rlkit.sandbox.wire import DEFAULT_MAX_QUEUE_S, encode_files

logger = logging.getLogger(__name__)
REPL_SOURCE = (Path(__file__).parent / "repl_server.py").read_text()
# Interpreter start is slow on a loaded machine; it is waited for separately from cell timeouts.
STARTUP_TIMEOUT_S = 60.0
# What is kept of the interpreter's own stderr (read as it comes, older bytes dropped): enough to
# tell why it died, never more however much a session writes there.
STDERR_TAIL = 65536


class CellResult(BaseModel):
    """Outcome of one cell: combined stdout+stderr (capped) and how the cell ended.

    `status` uses the sandbox vocabulary: "ok", "runtime_error" (the cell raised), "timeout",
    "memory", "output_limit" (output was truncated) or "sandbox_error".
    """

    status: Status
    output: str = ""
    duration: float = 0.0
    restarted: bool = False  # the interpreter died during this cell; its state is lost


class PythonSession:
    """`async with PythonSession() as py: await py.execute("x = 1"); await py.execute("x")`."""

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        memory_mb: int = 512,
        output_limit: int = 16384,
        lifetime_cpu_s: float = 600.0,
        files: dict[str, str | bytes] | None = None,
        sandbox: SandboxSettings | None = None,
    ) -> None:
        """`sandbox`: settings to run under here, on their backend, even when the process has a
        service configured (a service's own sessions); None: the process's settings."""
        self.timeout = timeout
        self.output_limit = output_limit
        # rlimits cover the whole interpreter lifetime, so CPU is a session budget.
        self.limits = (sandbox or settings()).limits(lifetime_cpu_s, memory_mb)
        self.backend_name = None if sandbox is None else sandbox.backend
        self.files = files or {}
        self._proc: asyncio.subprocess.Process | None = None
        self._stack: contextlib.ExitStack | None = None
        self._launch: Launch | None = None  # how the backend reads the interpreter's end
        self._stderr = bytearray()  # the interpreter's stderr, its last STDERR_TAIL bytes
        self._stderr_reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._remote = None if sandbox is not None else RemoteSession.configured(self)

    async def __aenter__(self) -> PythonSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def lost(self) -> str | None:
        """Why the sandbox service holding this session failed it (None: it did not); a
        rollout using the session is then errored with this reason (`PythonToolEnv`)."""
        return None if self._remote is None else self._remote.lost

    async def _start(self) -> asyncio.subprocess.Process | None:
        """Start the interpreter and wait until it is ready; None when it failed to start."""
        backend = (
            active_backend() if self.backend_name is None else checked_backend(self.backend_name)
        )
        self._stack = contextlib.ExitStack()
        launch = self._stack.enter_context(
            backend.prepare(REPL_SOURCE, "python", self.files, self.limits)
        )
        launch.argv.append(str(self.output_limit))
        self._launch = launch
        try:
            # Replies carry up to output_limit characters, JSON-escaped (at most 6 bytes each).
            self._proc = await spawn(launch, line_limit=6 * self.output_limit + 4096)
        except OSError:
            return None
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._stderr = bytearray()
        self._stderr_reader = asyncio.ensure_future(self._keep_tail(self._proc.stderr))
        try:
            ready = await asyncio.wait_for(self._proc.stdout.readline(), STARTUP_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if not ready.startswith(b'{"ready"'):
            return None
        return self._proc

    async def execute(self, code: str, timeout: float | None = None) -> CellResult:
        """Run one cell in the session's namespace; never raises for what the cell does."""
        if self._remote is not None:
            async with self._lock:
                return await self._remote.execute(code, timeout)
        async with self._lock:
            start = time.monotonic()
            if not self.alive:
                await self.close()  # release what an interpreter that exited left behind
            proc = self._proc if self.alive else await self._start()
            if proc is None:  # the sandbox itself did not come up: no user code ran
                await self.close()
                return CellResult(status="sandbox_error", duration=time.monotonic() - start)
            assert proc.stdin and proc.stdout
            try:
                proc.stdin.write((json.dumps({"code": code}) + "\n").encode())
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), timeout or self.timeout)
            except TimeoutError:
                await self.close()
                return CellResult(
                    status="timeout", duration=time.monotonic() - start, restarted=True
                )
            except (BrokenPipeError, ConnectionResetError, ValueError):
                line = b""  # the interpreter is gone (or answered garbage): handled below
            duration = time.monotonic() - start
            if not line:
                status = await self._died()
                return CellResult(status=status, duration=duration, restarted=True)
            try:
                reply = json.loads(line)
            except ValueError:  # the cell wrote into the reply channel: its own fault
                await self.close()
                return CellResult(status="runtime_error", duration=duration, restarted=True)
            status: Status = "ok"
            if reply["error"]:
                status = "memory" if "MemoryError" in reply["output"][-2000:] else "runtime_error"
            elif reply["truncated"]:
                status = "output_limit"
            return CellResult(status=status, output=reply["output"], duration=duration)

    async def _keep_tail(self, stream: asyncio.StreamReader) -> None:
        """Read the interpreter's stderr as it comes, keeping only its last bytes."""
        while chunk := await stream.read(65536):
            self._stderr += chunk
            del self._stderr[:-STDERR_TAIL]

    async def _died(self) -> Status:
        """Classify an interpreter that stopped answering, then clean up."""
        assert self._proc is not None
        proc = self._proc
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 2.0)
        if self._stderr_reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._stderr_reader), 1.0)
        code, text = proc.returncode, self._stderr.decode(errors="replace")
        ending = None if code is None or self._launch is None else self._launch.ending(code, text)
        await self.close()
        if ending is None or ending.setup_failed or ending.exit_code is None:
            return "sandbox_error"
        return classify(ending.exit_code, text)

    async def close(self) -> None:
        """Kill the interpreter and everything it started; the next cell starts a new one."""
        if self._remote is not None:
            await self._remote.close()
            return
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_tree(proc.pid)
            # Bounded: on Python 3.11 wait() also waits for pipes nobody may be reading.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5.0)
        if self._stderr_reader is not None:
            self._stderr_reader.cancel()
            self._stderr_reader = None
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        self._launch = None


class RemoteSession:
    """A `PythonSession`'s interpreter on the sandbox service, opened at its first cell."""

    def __init__(self, session: PythonSession) -> None:
        client = service()
        assert client is not None
        self.client = client
        self.options = {
            "timeout": session.timeout,
            "memory_mb": session.limits.memory_mb,
            "output_limit": session.output_limit,
            "lifetime_cpu_s": session.limits.timeout,
            "files": encode_files(session.files),
        }
        self.session_id: str | None = None
        self.base: str | None = None  # the service holding the interpreter
        self.lost: str | None = None  # why the session's service failed it, if it did

    async def _open(self, work_s: float) -> None:
        self.base, opened = await self.client.open_at("POST", "/sessions", self.options, work_s)
        self.session_id = opened["id"]

    @classmethod
    def configured(cls, session: PythonSession) -> RemoteSession | None:
        return None if service() is None else cls(session)

    async def execute(self, code: str, timeout: float | None) -> CellResult:
        start = time.monotonic()
        work_s = timeout or float(self.options["timeout"])
        body = {"code": code, "timeout": timeout, "max_queue_s": DEFAULT_MAX_QUEUE_S}
        restarted = False
        try:
            if self.session_id is None:
                await self._open(work_s)
            assert self.base is not None
            try:
                path = f"/sessions/{self.session_id}/execute"
                answer = await self.client.call_at(self.base, "POST", path, body, work_s)
            except KeyError:  # expired on the service: a fresh interpreter, state lost
                self.session_id = None
                restarted = True
                await self._open(work_s)
                path = f"/sessions/{self.session_id}/execute"
                answer = await self.client.call_at(self.base, "POST", path, body, work_s)
        except (ServiceError, KeyError) as exc:
            self.session_id = None  # whatever state the service held is out of reach
            self.lost = f"python session on the sandbox service failed: {exc}"
            logger.warning("%s", self.lost)
            return CellResult(
                status="sandbox_error",
                duration=time.monotonic() - start,
                restarted=True,
            )
        result = CellResult.model_validate(answer)
        return result.model_copy(update={"restarted": result.restarted or restarted})

    async def close(self) -> None:
        session_id, self.session_id = self.session_id, None
        if session_id is not None and self.base is not None:
            with contextlib.suppress(ServiceError, KeyError, ValueError):
                await self.client.call_at(
                    self.base, "DELETE", f"/sessions/{session_id}", None, 10.0
                )
