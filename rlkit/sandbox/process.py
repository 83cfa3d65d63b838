"""Run one prepared launch: feed stdin, read capped output, enforce the wall clock, kill the tree.

The program runs in its own process group (and, under bubblewrap, its own pid namespace whose
init dies with bwrap), so killing the group on the host ends every process it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

from rlkit.sandbox.launch import Launch
from rlkit.sandbox.result import SandboxResult, Status

READ_CHUNK = 64 * 1024
# Grace for the output pipes to reach EOF after the program ended and its group was killed.
DRAIN_S = 2.0


class _CappedReader:
    """Reads a stream incrementally, keeping at most `limit` bytes (host memory stays bounded)."""

    def __init__(self, stream: asyncio.StreamReader, limit: int) -> None:
        self.stream, self.limit = stream, limit
        self.data = bytearray()
        self.overflowed = False

    async def run(self, on_overflow: Callable[[], None]) -> None:
        while chunk := await self.stream.read(READ_CHUNK):
            if self.overflowed:
                continue  # drain to EOF: asyncio (3.11) only finishes wait() once pipes close
            room = self.limit - len(self.data)
            self.data += chunk[:room]
            if len(chunk) > room:
                self.overflowed = True
                on_overflow()

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def kill_tree(pid: int) -> None:
    """SIGKILL the process group led by `pid` (bwrap's pid namespace follows it down)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            stdin.write(data)
            await stdin.drain()
        stdin.close()
        await stdin.wait_closed()


def classify(exit_code: int, stderr: str) -> Status:
    """Tell memory exhaustion apart from other failures of a program that ran to its end."""
    if exit_code == 0:
        return "ok"
    if exit_code > 128:
        sig = exit_code - 128
        if sig in (signal.SIGXCPU, signal.SIGALRM):
            return "timeout"
        if sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS):
            # Under RLIMIT_AS a failed allocation often surfaces as a crash, not an exception.
            return "memory"
    tail = stderr[-2000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail or "cannot allocate" in tail:
        return "memory"
    return "runtime_error"


async def spawn(launch: Launch, line_limit: int = 2**16) -> asyncio.subprocess.Process:
    """Start a launch with pipes on all three streams, in a new session (its own process group).

    The descriptors only the child needs are closed here once it has inherited them.
    """
    try:
        return await asyncio.create_subprocess_exec(
            *launch.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=launch.pass_fds,
            cwd=launch.cwd,
            env=launch.env,
            preexec_fn=launch.preexec_fn,
            start_new_session=True,
            limit=line_limit,
        )
    finally:
        launch.close_child_fds()


async def execute(launch: Launch, stdin: str, timeout: float, output_limit: int) -> SandboxResult:
    """Run `launch` to completion (or until a limit) and classify how it ended."""
    start = time.monotonic()
    try:
        proc = await spawn(launch)
    except OSError as exc:
        return SandboxResult(status="sandbox_error", stderr=f"cannot start sandbox: {exc}")
    return await supervise(proc, launch, stdin.encode(), timeout, output_limit, start)


async def supervise(
    proc: asyncio.subprocess.Process,
    launch: Launch,
    stdin: bytes,
    timeout: float,
    output_limit: int,
    start: float,
) -> SandboxResult:
    """Feed `stdin` to a started sandbox, read its capped output until it ends or a limit
    strikes, kill its tree and classify how it ended (a fresh or a warm sandbox alike)."""
    assert proc.stdin and proc.stdout and proc.stderr
    out = _CappedReader(proc.stdout, output_limit)
    err = _CappedReader(proc.stderr, output_limit)
    tasks = [
        asyncio.ensure_future(_feed(proc.stdin, stdin)),
        asyncio.ensure_future(out.run(lambda: kill_tree(proc.pid))),
        asyncio.ensure_future(err.run(lambda: kill_tree(proc.pid))),
    ]
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        # Always: background processes the program left behind die with it.
        kill_tree(proc.pid)
        returncode = await proc.wait()
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
        for task in pending:
            task.cancel()
    duration = time.monotonic() - start
    stdout, stderr = out.text(), err.text()

    ending = launch.ending(returncode, stderr)
    exit_code = ending.exit_code
    status: Status
    if timed_out:
        status, exit_code = "timeout", None
    elif out.overflowed or err.overflowed:
        status, exit_code = "output_limit", None
    elif ending.setup_failed or exit_code is None:
        status = "sandbox_error"  # the backend failed, not the program
    else:
        status = classify(exit_code, stderr)
    return SandboxResult(
        status=status, stdout=stdout, stderr=stderr, exit_code=exit_code, duration=duration
    )
