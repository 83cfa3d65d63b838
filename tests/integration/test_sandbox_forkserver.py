"""Warm sandboxes forked by fork servers (`rlkit.sandbox.forkserver`): each request is as
isolated as in a sandbox of its own (fresh process, filesystem and namespace state, no
capability, nothing surviving it), however many requests one server has forked."""

from __future__ import annotations

import asyncio

import pytest

from rlkit.sandbox import backends
from rlkit.sandbox.forkserver import ForkPool
from rlkit.sandbox.pool import Profile
from rlkit.sandbox.runner import active_backend, limits
from tests.helpers.sandbox_service import marker, pids_with
from tests.helpers.system import require_system

pytestmark = pytest.mark.system

LEAVE_TRACES = """
import os, subprocess, socket
for path in ("/sandbox/left", "/tmp/left", "/dev/shm/left"):
    open(path, "w").write("x")
subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
server = socket.socket(); server.bind(("127.0.0.1", 7777)); server.listen()
print(os.getpid(), flush=True)
"""
LOOK = """
import os, socket
print(sorted(os.listdir(".")), os.path.exists("/tmp/left"), os.path.exists("/dev/shm/left"))
print(sorted(p for p in os.listdir("/proc") if p.isdigit()))
print(socket.gethostname(), open("/proc/self/status").read().split("CapEff:")[1].split()[0])
try:
    socket.create_connection(("127.0.0.1", 7777), timeout=1)
    print("reached")
except OSError:
    print("refused")
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()  # its own loopback works
import ctypes
print(ctypes.CDLL(None, use_errno=True).mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None))
"""


async def test_each_request_is_a_fresh_sandbox() -> None:
    require_system("bubblewrap", backends.Bwrap().problem() is None, "bwrap")
    pool = ForkPool(Profile(timeout=30, memory_mb=512), 1, active_backend())
    try:
        sleeper = marker()
        first = await (await pool.take()).run(
            LEAVE_TRACES.format(marker=sleeper),
            "python",
            "",
            {"a.txt": b"1"},
            limits(10, 256),
            4096,
        )
        assert first.status == "ok" and first.stdout == "1\n", first
        for _ in range(50):  # the server's next child starts once the last one is gone
            if not pids_with(sleeper):
                break
            await asyncio.sleep(0.1)
        assert pids_with(sleeper) == []
        second = await (await pool.take()).run(LOOK, "python", "", {}, limits(10, 256), 4096)
        assert second.status == "ok", second
        files, pids, host, reached, mounted = second.stdout.splitlines()
        assert files == "[] False False"  # a fresh working directory, /tmp and /dev/shm
        assert pids == "['1']"  # alone in its pid namespace: nothing of the first is left
        assert host == "sandbox 0000000000000000"  # no capability at all
        assert reached == "refused"  # its own network namespace
        assert mounted == "-1"
        assert len(pool.zygotes) == 1  # both from one server
    finally:
        await pool.close()


async def test_a_pool_of_size_zero_forks_on_demand() -> None:
    """`--pool-size 0`: no sandbox waits ready, each request is forked when it comes."""
    require_system("bubblewrap", backends.Bwrap().problem() is None, "bwrap")
    pool = ForkPool(Profile(timeout=30, memory_mb=512), 0, active_backend())
    try:
        for n in range(3):
            sandbox = await asyncio.wait_for(pool.take(), 30)
            result = await sandbox.run(f"print({n})", "python", "", {}, limits(10, 256), 4096)
            assert result.stdout == f"{n}\n"
        assert pool.stats.cold_starts == 3 and len(pool.zygotes) == 1
    finally:
        await pool.close()
