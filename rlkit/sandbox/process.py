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

from rlkit.sandbox.launch import Ending, Launch
from rlkit.sandbox.result import SandboxResult, Status

READ_CHUNK = 64 * 1024
# Grace for the output pipes to reach EOF after the program ended and its group was killed.
DRAIN_S = 2.0
# Room kept beyond the output limit for a warm sandbox's end marker (`loader.end_marker`).
MARKER_ROOM = 96
# Cleanups of sandboxes answered on their end markers, still being reaped.
_REAPING: set[asyncio.Task] = set()


class _CappedReader:
    """Reads a stream incrementally, keeping at most `limit` bytes (host memory stays bounded).
    With an `end` marker prefix (a warm sandbox), notes the program's exit code and calls
    `on_marked` once the stream ends with that marker (the program has ended and flushed:
    nothing more will come)."""

    def __init__(
        self,
        stream: asyncio.StreamReader,
        limit: int,
        end: bytes | None,
        on_marked: Callable[[], None],
    ) -> None:
        self.stream, self.limit, self.end, self.on_marked = stream, limit, end, on_marked
        self.data = bytearray()
        self.cut = False  # more came than the reader keeps
        self.code: int | None = None

    @property
    def overflowed(self) -> bool:
        return self.cut or len(self.data) > self.limit

    async def run(self, on_overflow: Callable[[], None]) -> None:
        keep = self.limit + (MARKER_ROOM if self.end else 0)
        while chunk := await self.stream.read(READ_CHUNK):
            if self.cut:
                continue  # drain to EOF: asyncio (3.11) only finishes wait() once pipes close
            room = keep - len(self.data)
            self.data += chunk[:room]
            if len(chunk) > room:
                self.cut = True
                on_overflow()
            elif self.end and self.code is None and self._take_marker(self.end):
                self.on_marked()

    def _take_marker(self, end: bytes) -> bool:
        """Whether the data ends with `end` + the exit code's digits + a newline (then the
        marker is cut off and the code kept): a plain byte comparison, no per-request regex."""
        if not self.data.endswith(b"\n"):
            return False
        at = self.data.rfind(end, max(0, len(self.data) - MARKER_ROOM))
        if at < 0:
            return False
        digits = self.data[at + len(end) : -1]
        if not 1 <= len(digits) <= 3 or not digits.isdigit():
            return False
        self.code = int(digits)
        del self.data[at:]
        return True

    def text(self) -> str:
        return self.data[: self.limit].decode("utf-8", errors="replace")


def kill_tree(pid: int) -> None:
    """SIGKILL the process group led by `pid` (bwrap's pid namespace follows it down)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _feed(stdin: asyncio.StreamWriter) -> None:
    """Drain what `supervise` wrote to the program's stdin, then close it (its EOF)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
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


def end_prefix(end: str) -> bytes:
    """What ends each stream of a warm sandbox's program that ended by itself with code N,
    before N and a newline: `loader.end_marker(end, N)` as the stream's last bytes."""
    return b"\x00rlkit-end:" + end.encode() + b":"


async def _reap(proc: asyncio.subprocess.Process, tasks: list[asyncio.Future]) -> int:
    """Wait for the killed sandbox to end and its pipes to drain (at most DRAIN_S more)."""
    returncode = await proc.wait()
    _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
    for task in pending:
        task.cancel()
    return returncode


async def supervise(
    proc: asyncio.subprocess.Process,
    launch: Launch,
    stdin: bytes,
    timeout: float,
    output_limit: int,
    start: float,
    end: str | None = None,
) -> SandboxResult:
    """Feed `stdin` to a started sandbox, read its capped output until it ends or a limit
    strikes, kill its tree and classify how it ended (a fresh or a warm sandbox alike).

    With `end` (a warm sandbox's nonce), both streams ending with its marker is the end: the
    answer comes at once and the killed sandbox is reaped in the background."""
    assert proc.stdin and proc.stdout and proc.stderr
    if stdin:
        # Written now, before the rest is set up, so a waiting sandbox starts on it at once;
        # what the pipe does not take now is drained by `_feed`.
        proc.stdin.write(stdin)
    marked: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_marked() -> None:
        if out.code is not None and err.code is not None and not marked.done():
            marked.set_result(None)

    prefix = end_prefix(end) if end else None
    out = _CappedReader(proc.stdout, output_limit, prefix, on_marked)
    err = _CappedReader(proc.stderr, output_limit, prefix, on_marked)
    tasks = [
        asyncio.ensure_future(_feed(proc.stdin)),
        asyncio.ensure_future(out.run(lambda: kill_tree(proc.pid))),
        asyncio.ensure_future(err.run(lambda: kill_tree(proc.pid))),
    ]
    exited = asyncio.ensure_future(proc.wait())
    try:
        done, _ = await asyncio.wait(
            {exited, marked}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
    finally:
        # Always: background processes the program left behind die with it.
        kill_tree(proc.pid)
        marked.cancel()
    timed_out = not done
    if marked in done and not exited.done():
        reaping = asyncio.ensure_future(_reap(proc, tasks))
        _REAPING.add(reaping)
        reaping.add_done_callback(_REAPING.discard)
        returncode = None
    else:
        returncode = await _reap(proc, tasks)
    duration = time.monotonic() - start
    stdout, stderr = out.text(), err.text()

    if returncode is None:  # answered on the markers: the loader reported the program's code
        ending = Ending(out.code)
    else:
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
