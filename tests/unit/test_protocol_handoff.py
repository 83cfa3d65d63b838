"""Doorbells (`rlkit.protocol.handoff`): a waiter sleeps until rung, re-checks its file, never
misses it."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from rlkit.protocol import handoff
from rlkit.protocol.layout import RunLayout


def write_and_ring_later(run_dir: Path, target: Path, role: str, delay: float = 0.2) -> None:
    def go() -> None:
        time.sleep(delay)
        target.write_text("x")
        handoff.ring(run_dir, role)

    threading.Thread(target=go, daemon=True).start()


def test_ring_wakes_every_rank_at_once(tmp_path: Path) -> None:
    bells = [handoff.Doorbell(tmp_path, f"{handoff.TRAINER}{rank}") for rank in range(2)]
    target = tmp_path / "batch"
    write_and_ring_later(tmp_path, target, handoff.TRAINER)
    for bell in bells:
        t0 = time.monotonic()
        assert bell.wait(target.exists, timeout=5)
        # woken by the ring, far sooner than the 1 s fallback poll
        assert time.monotonic() - t0 < 0.2 + 0.5
    for bell in bells:
        bell.close()
    assert not list(RunLayout(tmp_path).doorbells.iterdir())


def test_async_wait_lets_other_tasks_run(tmp_path: Path) -> None:
    bell = handoff.Doorbell(tmp_path, handoff.ORCHESTRATOR)
    target = tmp_path / "STABLE"
    ticks = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def main() -> float:
        task = asyncio.create_task(ticker())
        write_and_ring_later(tmp_path, target, handoff.ORCHESTRATOR)
        t0 = time.monotonic()
        assert await bell.wait_async(target.exists, timeout=5)
        task.cancel()
        return time.monotonic() - t0

    assert asyncio.run(main()) < 0.2 + 0.5
    assert len(ticks) > 5
    bell.close()


def test_file_present_before_waiting_or_ring_lost(tmp_path: Path) -> None:
    handoff.ring(tmp_path, handoff.TRAINER)  # nobody waits yet: no error, nothing left behind
    bell = handoff.Doorbell(tmp_path, f"{handoff.TRAINER}0")
    target = tmp_path / "batch"
    target.write_text("x")  # written without a ring (e.g. by another machine)
    assert bell.wait(target.exists, timeout=0.01)
    assert not bell.wait((tmp_path / "never").exists, timeout=0.1)
    bell.close()


def test_without_fifos_it_polls(tmp_path: Path, monkeypatch) -> None:
    def no_fifo(path: object) -> None:
        raise OSError("not supported")

    monkeypatch.setattr(handoff.os, "mkfifo", no_fifo)
    bell = handoff.Doorbell(tmp_path, handoff.ORCHESTRATOR)
    assert bell.fd is None and bell.poll_s == handoff.NO_FIFO_POLL_S
    target = tmp_path / "late"
    write_and_ring_later(tmp_path, target, handoff.ORCHESTRATOR, delay=0.1)
    assert asyncio.run(bell.wait_async(target.exists, timeout=5))
