"""Hand-offs between the processes of one training run: markers, notes and doorbells in run_dir.

The orchestrator and the trainer hand batches and weights to each other as files under
`run_dir` (`rlkit.protocol.layout`). A published weights folder is complete once its `STABLE`
marker exists (`mark_published`, written last); `STOP` and `TRAINER_FAILED` are notes one
process leaves the other. Waiting for such a file by sleep-polling
at 0.1-0.2 s cost every step several tenths of a second. A waiter instead opens a FIFO
`run_dir/.doorbells/NAME` and sleeps on it (select, or the asyncio loop); the writer rings every
doorbell of a role (one byte each, non-blocking) right after its file is in place. The waiter
always re-checks the file itself, so a ring that cannot arrive (no waiter yet, a waiter on
another machine, a filesystem without FIFOs) only costs the fallback poll interval.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

from rlkit.atomic import atomic_write
from rlkit.protocol.layout import RunLayout

STABLE = "STABLE"  # written last into a published weights folder: the folder is complete
DELIVERED = "DELIVERED"  # written by the orchestrator once a version reached the servers
TRAINER = "trainer."  # + rank: rung by the orchestrator when a step's batch is written
ORCHESTRATOR = "orchestrator"  # rung by the trainer when a step's metrics and weights are out
FALLBACK_POLL_S = 1.0  # re-check without a ring: other machines, a dead peer
NO_FIFO_POLL_S = 0.05  # polling interval where no FIFO can be made


def ring(run_dir: str | Path, role: str) -> None:
    """Wake every waiter whose doorbell name starts with `role`; never blocks or raises."""
    folder = RunLayout(run_dir).doorbells
    if not folder.is_dir():
        return
    for path in folder.glob(f"{role}*"):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader (ENXIO), gone, or not a FIFO: nobody to wake
            continue
        try:
            os.write(fd, b"\0")
        except OSError:  # pipe full: it has been rung already
            pass
        finally:
            os.close(fd)


class Doorbell:
    """The waiting side: `wait(ready)` returns once `ready()` is true (woken by `ring`)."""

    def __init__(self, run_dir: str | Path, name: str) -> None:
        self.path = RunLayout(run_dir).doorbells / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd: int | None = None
        try:
            if not self.path.exists():
                os.mkfifo(self.path)
            # read-write: the pipe always has a writer, so select never sees a spurious EOF
            self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        except (OSError, AttributeError):  # no FIFOs here: fall back to fast polling
            self.fd = None
        self.poll_s = FALLBACK_POLL_S if self.fd is not None else NO_FIFO_POLL_S

    def _drain(self) -> None:
        if self.fd is None:
            return
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def _next_pause(self, ready: Callable[[], bool], deadline: float | None) -> float | None:
        """Consume pending rings and look: None once `ready()`, else the seconds to wait before
        looking again (<= 0 once `deadline` has passed)."""
        self._drain()
        if ready():
            return None
        return self.poll_s if deadline is None else min(self.poll_s, deadline - time.monotonic())

    def wait(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until `ready()`; False if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (pause := self._next_pause(ready, deadline)) is not None:
            if pause <= 0:
                return False
            if self.fd is None:
                time.sleep(pause)
            else:
                select.select([self.fd], [], [], pause)
        return True

    async def wait_async(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """`wait` for an asyncio program: other tasks keep running meanwhile."""
        loop = asyncio.get_running_loop()
        rung = asyncio.Event()
        if self.fd is not None:
            loop.add_reader(self.fd, rung.set)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                rung.clear()  # a ring after this wakes the wait below
                pause = self._next_pause(ready, deadline)
                if pause is None:
                    return True
                if pause <= 0:
                    return False
                try:
                    await asyncio.wait_for(rung.wait(), pause)
                except TimeoutError:
                    pass
        finally:
            if self.fd is not None:
                loop.remove_reader(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.path.unlink(missing_ok=True)


def mark_published(folder: Path) -> None:
    """The last write of a published weights folder: readers may load it from now on."""
    (folder / STABLE).write_text("")


def is_published(folder: Path) -> bool:
    return (folder / STABLE).exists()


def mark_delivered(folder: Path) -> None:
    """The orchestrator has delivered the published version in `folder` to every server it
    could: a trainer holding the version's tensors for the servers (ipc) may let them go."""
    (folder / DELIVERED).write_text("")


def is_delivered(folder: Path) -> bool:
    return (folder / DELIVERED).exists()


def request_stop(run_dir: str | Path, reason: str) -> None:
    """Ask the trainer to checkpoint its last step and exit (it is waiting for a batch)."""
    atomic_write(RunLayout(run_dir).stop, reason)
    ring(run_dir, TRAINER)


def stop_requested(run_dir: str | Path) -> bool:
    return RunLayout(run_dir).stop.exists()


def clear_stop(run_dir: str | Path) -> None:
    """A resumed run starts without the previous run's stop request or trainer failure."""
    layout = RunLayout(run_dir)
    layout.stop.unlink(missing_ok=True)
    layout.trainer_failed.unlink(missing_ok=True)


def report_trainer_failure(run_dir: str | Path, reason: str) -> None:
    """Tell an orchestrator on another machine that the trainer exited (it stops instead of
    waiting out `weights_timeout_s`)."""
    atomic_write(RunLayout(run_dir).trainer_failed, reason)
    ring(run_dir, ORCHESTRATOR)


def trainer_failure(run_dir: str | Path) -> str | None:
    """The reason a trainer node reported, or None."""
    try:
        return RunLayout(run_dir).trainer_failed.read_text()
    except FileNotFoundError:
        return None
