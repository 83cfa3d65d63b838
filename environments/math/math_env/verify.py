"""Answer checking with math-verify in worker processes that are killed on timeout.

math-verify can hang on pathological input (sympy evaluating `9^{9^{9^{9^{9}}}}`), and its own
timeouts use SIGALRM, which only works in a main thread. So every check runs in a pebble process
pool: a check that exceeds `timeout` is answered False and its worker is killed and replaced,
without disturbing the event loop or other checks. Workers come from a forkserver (a clean
single-threaded process with math-verify imported and warmed up; plain fork is unsafe in a
threaded async program), so replacing a killed worker costs milliseconds, not a sympy import.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import TimeoutError as FutureTimeoutError

from pebble import ProcessPool
from pebble.common import ProcessExpired

logger = logging.getLogger(__name__)


def _init_worker() -> None:
    """Import and warm math-verify up before the first check, so the timeout (which starts when
    a worker picks a task up) measures checking, not sympy's import. Also silence the warning
    math-verify logs on every call when its own timeouts are off (we enforce ours)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    verify_answer("1", "1")


def verify_answer(gold: str, predicted: str) -> bool:
    """True when `predicted` is mathematically equivalent to `gold` (both plain LaTeX)."""
    from math_verify import parse, verify

    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    predicted_parsed = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
    if not gold_parsed or not predicted_parsed:
        return False
    return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=None))


class MathVerifier:
    """An async front to a pool of math-verify worker processes, started on first use."""

    def __init__(self, workers: int = 2, timeout: float = 5.0) -> None:
        if workers < 1 or timeout <= 0:
            raise ValueError(f"need workers >= 1 and timeout > 0, got {workers}, {timeout}")
        self.workers = workers
        self.timeout = timeout
        self._pool: ProcessPool | None = None

    def _get_pool(self) -> ProcessPool:
        if self._pool is None or not self._pool.active:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["math_env._preload"])
            self._pool = ProcessPool(
                max_workers=self.workers, initializer=_init_worker, context=context
            )
        return self._pool

    async def verify(self, gold: str, predicted: str) -> bool:
        """Equivalence check; False on timeout or when a worker dies."""
        future = self._get_pool().schedule(
            verify_answer, args=(gold, predicted), timeout=self.timeout
        )
        try:
            return await asyncio.wrap_future(future)
        except FutureTimeoutError:
            logger.info("math-verify timed out after %.1fs on %.80r", self.timeout, predicted)
            return False
        except ProcessExpired as exc:
            logger.warning("math-verify worker died (%s) on %.80r", exc, predicted)
            return False

    def close(self) -> None:
        """Stop the workers now (pebble also stops its pools at interpreter exit)."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None
