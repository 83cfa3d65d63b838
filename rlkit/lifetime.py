"""Children of `rlkit train` die with it, also when it is killed with SIGKILL (Linux).

The launcher starts its inference servers and trainer in their own sessions (so it can stop each
process group), which also means nothing reaps them if the launcher itself is killed. On Linux
each child asks the kernel for a parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) between
fork and exec (`preexec_fn=die_with_parent_preexec()`); torchrun's ranks do the same in-process
(`die_with_parent()`), so killing the launcher kills torchrun and then its ranks. The signal is
tied to the thread that started the child, so start children from a thread that outlives them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent_preexec() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGKILL when this process dies.

    Everything is resolved before fork; if this process already died before the child got to
    prctl, the child exits at once instead of running as an orphan.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def die_with_parent() -> None:
    """In-process variant for a process whose parent is not rlkit (torchrun's ranks)."""
    prctl = _prctl()
    if prctl is not None and os.getppid() != 1:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def stop_process_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the child's process group and return once no process of it is left, SIGKILLing
    what is still there after `timeout`. The leader exiting is not enough: a vLLM API server
    exits before its engine core does, which must not outlive the caller."""
    deadline = time.monotonic() + timeout
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while (proc.poll() is None or group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    give_up = time.monotonic() + 10.0  # SIGKILLed processes need a moment to be torn down
    while group_members(proc.pid) and time.monotonic() < give_up:
        time.sleep(0.1)


SERVER_PID_ENV = "RLKIT_API_SERVER_PID"  # set by rlkit's vLLM API server for its engine processes


def follow_process(pid: int, interval_s: float = 1.0) -> None:
    """Daemon thread: SIGKILL this process group once `pid` is gone.

    vLLM's engine and worker processes are grandchildren of the launcher and have no
    parent-death signal of their own; the worker extension starts this on the API server's pid,
    so a killed server takes its whole process group with it.
    """
    import threading
    import time

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            time.sleep(interval_s)

    threading.Thread(target=watch, name="rlkit-follow-server", daemon=True).start()


def process_alive(pid: int) -> bool:
    """Whether `pid` is a running process of this user: one killed but not yet reaped is a
    zombie (it holds no memory or sockets any more), another user's process that now has the
    pid is not ours."""
    proc = Path(f"/proc/{pid}")
    try:
        if proc.stat().st_uid != os.getuid():
            return False
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass(kw_only=True)
class ChildProcess:
    """One child of rlkit (an inference server, a trainer, a sandbox service): its own process
    group (stopped by its id, never by name), a parent-death signal, its output appended to
    `log_path`, whose tail goes into any error about it."""

    process: subprocess.Popen
    log_path: Path
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    what: ClassVar[str] = "child process"  # how errors name it
    tail_lines: ClassVar[int] = 40  # how much of its log an error shows

    @staticmethod
    def launch(
        argv: list[str], log_path: Path, env: dict[str, str]
    ) -> tuple[subprocess.Popen, IO[bytes]]:
        """Start `argv` with its output appended to `log_path`; the process and the open log."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")
        try:
            process = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent_preexec(),
            )
        except BaseException:
            log_file.close()
            raise
        return process, log_file

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int | None = None) -> str:
        lines = lines or self.tail_lines
        try:
            return "\n".join(self.log_path.read_text(errors="ignore").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_healthy(self, url: str, timeout: float, poll_s: float = 0.5) -> None:
        """Block until `url` answers 200; raise RuntimeError with the log tail when the process
        exits first or `timeout` runs out (then stop it)."""
        import httpx

        deadline = time.monotonic() + timeout
        # one client for every poll: a new one (what `httpx.get` makes) loads the system's CA
        # certificates, CPU taken from the starting process each time
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.what} exited with code {self.process.returncode} before it "
                        f"was ready; log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(poll_s)
        self.stop()
        raise RuntimeError(
            f"{self.what} not ready after {timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the whole process group (`stop_process_group`) and close the log."""
        stop_process_group(self.process, timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
