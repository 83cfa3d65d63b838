"""Stopping a child's process group: nothing of it is left when `stop_process_group` returns,
also when the leader exits before its children (as a vLLM API server exits before its engine
core) and when a child ignores SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import time

from rlkit.lifetime import group_members, stop_process_group

# The leader starts one child in its own process group and exits at once on SIGTERM; the child
# needs `delay` seconds to finish after SIGTERM, or ignores it when `delay` is negative. Each
# says it is ready (a line on stdout) only once its handler is installed.
LEADER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""
CHILD = """
import signal, sys, time
delay = {delay}
def slow_exit(*_):
    time.sleep(delay)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if delay < 0 else slow_exit)
print("ready", flush=True)
time.sleep(600)
"""


def start_group(delay: float) -> tuple[subprocess.Popen, int]:
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER, CHILD.format(delay=delay)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # the leader prints its child's pid once both have installed their handlers (a fixed sleep
    # was too short on a loaded machine: the child died of SIGTERM before ignoring it)
    child = int(leader.stdout.readline())  # type: ignore[union-attr]
    return leader, child


def test_a_child_slower_than_its_leader_is_waited_for() -> None:
    leader, child = start_group(delay=1.5)
    assert child in group_members(leader.pid)
    stop_process_group(leader, timeout=30.0)
    assert leader.returncode == 0  # the leader stopped on SIGTERM, not by SIGKILL
    assert group_members(leader.pid) == []


def test_a_child_ignoring_sigterm_is_killed_after_the_timeout() -> None:
    leader, _ = start_group(delay=-1)
    started = time.monotonic()
    stop_process_group(leader, timeout=2.0)
    assert time.monotonic() - started >= 2.0  # it had its grace period
    assert group_members(leader.pid) == []
