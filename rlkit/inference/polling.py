"""Bound the busy-wait of vLLM's shared-memory message queue (a small, documented patch).

vLLM's worker process reads the engine's scheduler messages from a shared-memory ring
(`vllm/distributed/device_communicators/shm_broadcast.py`, `SpinCondition`). After every read it
spins with `sched_yield` for `busy_loop_s` (1 s in vLLM 0.32, not configurable) before it sleeps
on a zmq notification. On a GPU box that costs one idle host core; on a CPU machine shared with
the trainer it takes a core from the trainer for a second after every generation burst, which is
most of a training step. While decoding, messages arrive milliseconds apart, so a short window
keeps the fast path and the worker sleeps as soon as generation stops.

A sleeping reader wakes on a zmq notification that vLLM itself says can be lost; it then
re-reads the ring only every 5 s (`SHM_READER_RECHECK_INTERVAL_MS`). With vLLM's 1 s window
readers rarely sleep, but with a short one they sleep between every burst, and a lost
notification stalled a weight update or a rollout for those 5 s now and then. So the
patched reader also re-reads the ring every `IDLE_RECHECK_MS` while asleep: a few dozen flag
checks per second, no measurable CPU.

`rlkit train` sets `RLKIT_VLLM_BUSY_LOOP_S` for the servers it launches on CPU
(`inference.busy_loop_s`); the worker extension applies it when vLLM imports it in each worker.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("vllm.rlkit.polling")  # under vLLM's logger: lands in the server log

ENV_VAR = "RLKIT_VLLM_BUSY_LOOP_S"
CPU_DEFAULT_S = 0.005  # longer than one CPU decode step's gap, far shorter than a train step
IDLE_RECHECK_MS = 20  # a lost notification costs at most this (vLLM's own cap: 5,000 ms)


def limit_busy_loop(seconds: float) -> None:
    """Make every shared-memory queue reader in this process spin at most `seconds`."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = getattr(SpinCondition.wait, "__rlkit_original__", SpinCondition.wait)

    def wait(self: Any, timeout_ms: int | None = None) -> None:
        self.busy_loop_s = seconds  # readers built before the patch keep vLLM's 1 s otherwise
        recheck = IDLE_RECHECK_MS if timeout_ms is None else min(timeout_ms, IDLE_RECHECK_MS)
        original(self, recheck)

    wait.__rlkit_original__ = original  # type: ignore[attr-defined]
    SpinCondition.wait = wait


def busy_loop_env(configured: float | None, on_gpu: bool) -> dict[str, str]:
    """Server environment for a window: `configured`, else 5 ms on CPU and vLLM's own on GPU."""
    seconds = configured if configured is not None else (None if on_gpu else CPU_DEFAULT_S)
    return {} if seconds is None else {ENV_VAR: repr(float(seconds))}


def apply_from_env() -> float | None:
    """Apply `RLKIT_VLLM_BUSY_LOOP_S` if set; returns the window applied (None = vLLM's own)."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    seconds = float(raw)
    if seconds < 0:
        raise ValueError(f"{ENV_VAR} must be >= 0, got {raw!r}")
    limit_busy_loop(seconds)
    log.info("rlkit: vLLM shared-memory busy-wait limited to %s s (%s)", seconds, ENV_VAR)
    return seconds
