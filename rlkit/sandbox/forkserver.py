"""Warm sandboxes forked from fork servers: a pool whose refill is a fork, not a sandbox start.

A `WarmPool` refills itself by starting bubblewrap and an interpreter for every request (most of
a request's CPU on a busy host). A `ForkPool` keeps `size` fork servers instead (`zygote.py`,
each in a bubblewrap sandbox and a host uid of its own) and asks one for each warm sandbox: the
server forks a child that unshares fresh mount, pid, ipc, network and uts namespaces, mounts
fresh size-capped tmpfs over /sandbox, /tmp and /dev/shm and a fresh /proc, drops every
capability, and runs the loader (`loader.py`), as a sandbox of its own would. Isolation per
request is the same as a new sandbox's: a fresh process (a fork of a server no request runs
in), fresh filesystem and namespace state, nothing surviving it (the kernel kills a pid
namespace with its pid 1). Each server holds one child at a time, so the sandbox's process
budget (RLIMIT_NPROC) is one request's, plus the server and the child's parent.

The host reads the request's host pid from the child (SCM_CREDENTIALS) so it kills and
supervises it exactly as a sandbox of its own (`process.supervise`), and how it ended from its
parent in the server. bubblewrap only: another backend keeps `WarmPool`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import marshal
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

from rlkit.sandbox.launch import Ending, Launch, prepare_bwrap, process_ending
from rlkit.sandbox.limits import MIB, SHM_MB, TMP_MB, WORKDIR_MB, Limits
from rlkit.sandbox.pool import (
    LOADER_SOURCE,
    MARSHAL_VERSION,
    READY,
    STARTUP_TIMEOUT_S,
    Profile,
    WarmPool,
    WarmSandbox,
)
from rlkit.sandbox.process import kill_tree, spawn

LOADER_MAIN = 'if __name__ == "__main__":\n    main()\n'
ZYGOTE_SOURCE = (
    LOADER_SOURCE.replace(LOADER_MAIN, "") + (Path(__file__).parent / "zygote.py").read_text()
)
CAPS = ("CAP_SYS_ADMIN", "CAP_NET_ADMIN")  # in the server's own user namespace only
# Processes of the sandbox's uid besides a request's own: bubblewrap's init, the server, the
# child's parent in it (RLIMIT_NPROC counts them all).
SERVER_PROCESSES = 3
SETUP_FAILED = "sandbox setup failed"
ZYGOTE_CPU_S = 3600.0  # a server's own CPU over its life (a fork ~1 ms: ~10^6 requests)


class ForkedProcess:
    """What `process.supervise` needs of a process, for a request a fork server started."""

    def __init__(
        self,
        pid: int,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        ended: asyncio.Future[int],
    ) -> None:
        self.pid, self.stdin, self.stdout, self.stderr = pid, stdin, stdout, stderr
        self._ended = ended

    @property
    def returncode(self) -> int | None:
        return self._ended.result() if self._ended.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)


class _PipeWriter(asyncio.streams.FlowControlMixin):
    """The write end of a request's stdin as a `StreamWriter`'s protocol (with its close
    waiter, which `StreamWriter.wait_closed` asks for)."""

    def __init__(self) -> None:
        super().__init__()
        self._closed = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future:
        return self._closed


def _forked_ending(returncode: int, stderr: str) -> Ending:
    """The server's setup of a child failed (not its program): a `sandbox_error`."""
    if returncode == 125 and stderr.startswith(SETUP_FAILED):
        return Ending(None, setup_failed=True)
    return process_ending(returncode, stderr)


class Zygote:
    """One fork server and the child it holds (at most one at a time)."""

    def __init__(self, proc: asyncio.subprocess.Process, control: socket.socket, stack):
        self.proc, self.control, self.stack = proc, control, stack
        self.idle = asyncio.Event()  # no child of this server is alive
        self.idle.set()
        self.on_idle: Callable[[], None] = lambda: None

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    @classmethod
    async def start(cls, limits: Limits) -> Zygote | None:
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_fd = server_end.fileno()
        stack = contextlib.ExitStack()
        stack.callback(host_end.close)
        try:
            launch = stack.enter_context(
                prepare_bwrap(ZYGOTE_SOURCE, "python", {}, limits, caps=CAPS, keep_fds=(server_fd,))
            )
            proc = await spawn(launch)
        except OSError:
            stack.close()
            return None
        finally:
            server_end.close()
        zygote = cls(proc, host_end, stack)
        sizes = {"/sandbox": WORKDIR_MB * MIB, "/tmp": TMP_MB * MIB, "/dev/shm": SHM_MB * MIB}
        setup = marshal.dumps({"control": server_fd, "sizes": sizes}, MARSHAL_VERSION)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"%d\n" % len(setup) + setup)
            ready = await asyncio.wait_for(proc.stdout.readexactly(len(READY)), STARTUP_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            ready = b""
        except BaseException:
            zygote.close()
            raise
        if ready != READY:
            zygote.close()
            return None
        return zygote

    async def child(self) -> WarmSandbox | None:
        """A warm sandbox forked by this server (which is busy until it has ended)."""
        self.idle.clear()
        if not self.alive:
            return None
        loop = asyncio.get_running_loop()
        stack = contextlib.ExitStack()
        pipes = [os.pipe() for _ in range(3)]
        report, child_report = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        report.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        report.setblocking(False)
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], child_report.detach()]
        pid_known: asyncio.Future[int] = loop.create_future()
        ended: asyncio.Future[int] = loop.create_future()
        ended.add_done_callback(lambda _: (self.idle.set(), self.on_idle()))

        def on_report() -> None:
            try:
                data, ancillary, _, _ = report.recvmsg(256, socket.CMSG_SPACE(12))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, ancillary = b"", []
            if data == b"pid":
                for level, kind, creds in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        if not pid_known.done():
                            pid_known.set_result(struct.unpack("3i", creds[:12])[0])
                return
            loop.remove_reader(report.fileno())
            word, _, value = data.partition(b" ")
            code = {b"exit": 1, b"signal": -1}.get(word)
            result = code * int(value) if code is not None and value.isdigit() else -9
            if word == b"setup" or not data:  # the child's parent failed, or died
                result = 125 if word == b"setup" else -9
            if not ended.done():
                ended.set_result(result)
            if not pid_known.done():
                pid_known.set_result(0)

        def close_report(_: object = None) -> None:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(report.fileno())
            report.close()

        def release() -> None:
            """The server is idle again once the child's parent reports its end (the
            request's whole pid namespace gone), not before."""
            if ended.done():
                close_report()
            else:
                ended.add_done_callback(close_report)

        stack.callback(release)
        try:
            self.control.sendmsg(
                [b"r"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("4i", *theirs))]
            )
        except OSError:
            stack.close()
            return None
        finally:
            for fd in theirs:
                os.close(fd)
        loop.add_reader(report.fileno(), on_report)
        stdin_t, stdin_p = await loop.connect_write_pipe(
            _PipeWriter, os.fdopen(pipes[0][1], "wb", buffering=0)
        )
        stdin = asyncio.StreamWriter(stdin_t, stdin_p, None, loop)
        readers = []
        for read_end in (pipes[1][0], pipes[2][0]):
            reader = asyncio.StreamReader(limit=2**16, loop=loop)
            transport, _ = await loop.connect_read_pipe(
                lambda r=reader: asyncio.StreamReaderProtocol(r, loop=loop),
                os.fdopen(read_end, "rb", buffering=0),
            )
            stack.callback(transport.close)
            readers.append(reader)
        stack.callback(stdin_t.close)
        try:
            pid = await asyncio.wait_for(asyncio.shield(pid_known), STARTUP_TIMEOUT_S)
            ready = await asyncio.wait_for(readers[0].readexactly(len(READY)), STARTUP_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError):
            pid, ready = 0, b""
        except BaseException:
            stack.close()
            raise
        proc = ForkedProcess(pid, stdin, readers[0], readers[1], ended)
        if ready != READY or pid <= 0:
            if pid > 0:
                kill_tree(pid)
            stack.close()
            return None
        sandbox = WarmSandbox(proc, Launch(argv=[], ending=_forked_ending), stack)  # type: ignore[arg-type]
        sandbox.extra_processes = SERVER_PROCESSES - 1  # bubblewrap's init is in Limits.nproc
        return sandbox

    def close(self) -> None:
        kill_tree(self.proc.pid)
        self.stack.close()


class ForkPool(WarmPool):
    """Up to `size` warm sandboxes of one profile, each forked by a fork server of its own."""

    def __init__(self, profile: Profile, size: int, backend) -> None:
        super().__init__(profile, size, backend)
        # room for the servers' own processes beside a request's whole budget, and CPU time
        # for a server's forks over its life (each child lowers both to its request's)
        self.limits = Limits(
            max(profile.timeout, ZYGOTE_CPU_S),
            profile.memory_mb,
            profile.memory_mb * 64,
            max_processes=64 + SERVER_PROCESSES,
        )
        self.zygotes: list[Zygote] = []
        self._starting_zygotes = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False

    def _wake_one(self) -> None:
        """A sandbox became ready or a server idle: the longest waiting `take` looks again
        (one, not all: each woken waiter would scan the pool)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _server_idle(self) -> None:
        """A server's child has ended: a waiting `take` may use it, and the pool refills."""
        self._wake_one()
        if not self._closing:
            self.fill()

    async def _free_zygote(self) -> Zygote | None:
        """An idle live server, or a new one while fewer than `size` exist; else None."""
        self.zygotes = [z for z in self.zygotes if z.alive or z.close()]
        for zygote in self.zygotes:
            if zygote.idle.is_set():
                zygote.idle.clear()  # taken now: no other start may use it
                return zygote
        if len(self.zygotes) + self._starting_zygotes >= max(1, self.size):
            return None
        self._starting_zygotes += 1
        try:
            zygote = await Zygote.start(self.limits)
        finally:
            self._starting_zygotes -= 1
        if zygote is None:
            self.stats.start_failures += 1
            return None
        zygote.on_idle = self._server_idle
        self.zygotes.append(zygote)
        zygote.idle.clear()
        return zygote

    async def _start(self) -> WarmSandbox | None:
        began = asyncio.get_running_loop().time()
        zygote = await self._free_zygote()
        if zygote is None:
            return None
        sandbox = await zygote.child()
        if sandbox is None:
            self.stats.start_failures += 1
            zygote.close()
            return None
        took = asyncio.get_running_loop().time() - began
        self.stats.start_seconds = [*self.stats.start_seconds[-99:], took]
        return sandbox

    async def _start_into_pool(self) -> None:
        await super()._start_into_pool()
        self._wake_one()

    async def take(self) -> WarmSandbox | None:
        """A ready sandbox (warm), else one forked now by a free server (cold), else the next
        to become ready or free; None when no server starts."""
        cold = False
        while True:
            while self.ready:
                sandbox = self.ready.pop()
                if sandbox.alive:
                    if cold:
                        self.stats.cold_starts += 1
                    else:
                        self.stats.warm_starts += 1
                    return sandbox
                self.stats.start_failures += 1
                sandbox.discard()
            cold = True
            servers = len(self.zygotes) + self._starting_zygotes
            if any(z.idle.is_set() for z in self.zygotes) or servers < max(1, self.size):
                sandbox = await self._start()
                if sandbox is not None:
                    self.stats.cold_starts += 1
                    return sandbox
                if not self.zygotes and not self._starting_zygotes:
                    return None  # no server would start
            if not self.ready:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._wake_one()  # woken, then cancelled: pass the turn on
                    raise

    async def close(self) -> None:
        self._closing = True
        await super().close()
        for zygote in self.zygotes:
            zygote.close()
        for zygote in self.zygotes:  # reaped, so no transport outlives its loop
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(zygote.proc.wait(), 5.0)
        self.zygotes.clear()
