"""Virtual time for asyncio: an event loop whose clock jumps to the next timer when idle.

`VirtualTimeLoop` is asyncio's own selector loop with one difference: its selector never
sleeps. When no callback is ready, asyncio asks the selector to wait until the earliest timer;
this selector polls the real file descriptors without blocking and, if nothing is there,
advances the loop's clock by exactly that wait. So `asyncio.sleep`, `loop.call_at`,
`asyncio.wait_for` and `loop.time()` all run unmodified in simulated seconds, and a simulated
hour takes as long as the callbacks it runs. Files (sockets, pipes) are polled whenever no
callback is ready, just before the clock would advance. Code that reads the event loop's clock
(the schedulers do) sees simulated time; code that reads `time.monotonic()` directly does not.
"""

from __future__ import annotations

import asyncio
import gc
import selectors
from typing import Any

GC_THRESHOLD = 100_000  # net allocations between young-generation collections during a run
REAL_WAIT_S = 1.0  # with no timer left: how long to wait for a thread's wake-up before failing


class SimulationStalled(RuntimeError):
    """Every task waits and no timer is scheduled: nothing can ever happen again."""


class _VirtualSelector(selectors.BaseSelector):
    """A real selector that polls instead of blocking and advances the virtual clock."""

    def __init__(self) -> None:
        self.real = selectors.DefaultSelector()
        self.now = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self.real.get_map()

    def close(self) -> None:
        self.real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0:
            # Callbacks are ready: the files wait until the loop is about to advance the clock,
            # which in a simulation comes within microseconds. A thread's call_soon_threadsafe
            # has queued its callback already (its byte on the self-pipe only wakes a blocking
            # select, which this one never is), so a pure simulation runs the same callbacks in
            # the same order, without a system call per loop iteration (most of them).
            return []
        events = self.real.select(0)
        if events:
            return events
        if timeout is None:  # no timer at all: only another thread could wake the loop
            events = self.real.select(REAL_WAIT_S)
            if not events:
                raise SimulationStalled(
                    "simulation stalled: every task is waiting and no timer is scheduled"
                )
            return events
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio's selector event loop on a virtual clock that starts at 0.0."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


def run_virtual(coro: Any) -> Any:
    """Run `coro` to completion on a fresh `VirtualTimeLoop` (like `asyncio.run`).

    Meanwhile the garbage collector leaves alone the objects alive before the run (the
    imported modules: torch's alone are ~300k objects) and runs after 100,000 net allocations
    instead of 700: a step's records live until the next step, so at a lower threshold the
    collections scan them again and again (docs/benchmarks.md). Its records hold
    few reference cycles, so the higher threshold costs little memory."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *threshold[1:])
    try:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            return runner.run(coro)
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
