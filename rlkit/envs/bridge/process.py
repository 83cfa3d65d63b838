"""One bridge worker process: spawn, request/response over JSON lines, restart on failure.

Requests may be sent from any thread or event loop: a reader thread resolves
`concurrent.futures.Future`s by request id, which async callers await through
`asyncio.wrap_future`. A worker that exits, writes a line that is not a protocol reply, or stops
answering pings is killed; every request in flight fails with `WorkerFailed` (the caller turns
that into an errored rollout) and the next request starts a fresh worker. A worker that cannot
even start fails its requests at once with the start error (no restart loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
WORKER_SCRIPT = Path(__file__).resolve().parent / "worker" / "vf_worker.py"
STDERR_TAIL_LINES = 40


class WorkerFailed(RuntimeError):
    """The worker died, hung or broke the protocol; in-flight requests get this."""


class WorkerProcess:
    """A restartable worker running `python WORKER_SCRIPT SPEC` (or `argv`, in tests)."""

    def __init__(
        self,
        python: str,
        spec: dict[str, Any],
        *,
        start_timeout_s: float = 300.0,
        ping_interval_s: float = 15.0,
        ping_timeout_s: float = 30.0,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = argv or [python, "-u", str(WORKER_SCRIPT), json.dumps(spec)]
        self.env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": "", **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: dict[int, concurrent.futures.Future] = {}
        self.ids = itertools.count(1)
        self.ready: concurrent.futures.Future | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.restarts = 0
        self.generation = 0  # bumps on every start, so stale reader threads stay quiet
        self.start_error: str | None = None

    # ---- lifecycle --------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Start the worker if needed and return its `describe` (sent when it is ready)."""
        return self._ensure_started().result(timeout=self.start_timeout_s)

    def _ensure_started(self) -> concurrent.futures.Future:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None and self.ready is not None:
                return self.ready
            if self.proc is not None:  # it died; its reader may not have noticed yet
                self._fail_locked(
                    self.generation, f"bridge worker exited with code {self.proc.returncode}"
                )
                self.restarts += 1
            return self._start_locked()

    def _start_locked(self) -> concurrent.futures.Future:
        self.generation += 1
        self.ready = concurrent.futures.Future()
        self.pending = {0: self.ready}
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        gen, proc = self.generation, self.proc
        threading.Thread(target=self._read, args=(gen, proc), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(proc,), daemon=True).start()
        threading.Thread(target=self._watch, args=(gen,), daemon=True).start()
        return self.ready

    def kill(self, reason: str) -> None:
        """Kill the worker and fail everything in flight with `reason`."""
        with self.lock:
            self._fail_locked(self.generation, reason)

    def _fail_locked(self, gen: int, reason: str) -> None:
        if gen != self.generation or self.proc is None:
            return
        proc, pending = self.proc, self.pending
        self.pending = {}
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        tail = "".join(self.stderr_tail).strip()[-2000:]
        message = f"{reason}" + (f"\nworker stderr:\n{tail}" if tail else "")
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerFailed(message))
        self.generation += 1  # its reader thread must not touch the next worker's requests

    def close(self) -> None:
        """Stop the worker (closing its stdin lets it finish; then it is killed)."""
        with self.lock:
            proc = self.proc
            if proc is None:
                return
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, OSError):
                pass
            self._fail_locked(self.generation, "the bridge worker was closed")
            self.proc = None

    def _watch(self, gen: int) -> None:
        """While requests are in flight, ping; a worker whose loop is stuck gets killed."""
        assert self.ready is not None
        ready = self.ready
        try:
            ready.result(timeout=self.start_timeout_s)
        except Exception:
            return
        while gen == self.generation:
            time.sleep(self.ping_interval_s)
            with self.lock:
                busy = gen == self.generation and len(self.pending) > 0
            if not busy:
                continue
            t0 = time.monotonic()
            try:
                _, pong = self.submit("ping")
                pong.result(timeout=self.ping_timeout_s)
            except concurrent.futures.TimeoutError:
                with self.lock:
                    self._fail_locked(
                        gen,
                        f"bridge worker did not answer a ping in {time.monotonic() - t0:.0f}s "
                        "(its event loop is blocked); restarting it",
                    )
                return
            except Exception:
                return

    # ---- reading ----------------------------------------------------------------------------
    def _read(self, gen: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                message = json.loads(line)
                rid = message["id"]
                ok = bool(message["ok"])
            except (ValueError, KeyError, TypeError):
                with self.lock:
                    self._fail_locked(gen, f"bridge worker wrote garbage: {line[:200]!r}")
                return
            with self.lock:
                if gen != self.generation:
                    return
                future = self.pending.pop(rid, None) if rid is not None else None
            if future is None or future.done():
                if rid is None:
                    log.warning("bridge worker: %s", message.get("error"))
                continue
            if ok:
                future.set_result(message.get("result"))
            elif rid == 0:
                with self.lock:
                    self.start_error = str(message.get("error"))
                future.set_exception(
                    WorkerFailed(f"the environment failed to load: {message.get('error')}")
                )
            else:
                future.set_exception(WorkerError(str(message.get("error"))))
        code = proc.wait()
        with self.lock:
            self._fail_locked(gen, f"bridge worker exited with code {code}")

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.stderr_tail.append(line)
            if os.environ.get("RLKIT_BRIDGE_DEBUG"):
                log.warning("bridge worker: %s", line.rstrip())

    # ---- requests ---------------------------------------------------------------------------
    def submit(self, op: str, **fields: Any) -> tuple[int, concurrent.futures.Future]:
        """Send one request; returns (request id, future of its result)."""
        ready = self._ensure_started()
        if ready.done() and ready.exception() is not None:
            raise ready.exception()  # type: ignore[misc]
        with self.lock:
            rid = next(self.ids)
            future: concurrent.futures.Future = concurrent.futures.Future()
            self.pending[rid] = future
            proc = self.proc
            try:
                assert proc is not None and proc.stdin is not None
                proc.stdin.write((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())
                proc.stdin.flush()
            except (OSError, ValueError) as exc:
                self.pending.pop(rid, None)
                self._fail_locked(self.generation, f"cannot write to the bridge worker: {exc}")
                future.set_exception(WorkerFailed(f"cannot write to the bridge worker: {exc}"))
        return rid, future

    def call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        """Synchronous request (used while loading, outside any event loop)."""
        self.describe()  # wait until it is ready (raises its load error)
        _, future = self.submit(op, **fields)
        return future.result(timeout=timeout)

    async def acall(self, op: str, timeout: float, **fields: Any) -> Any:
        """Request from an event loop; past `timeout` the request is cancelled in the worker."""
        ready = self._ensure_started()
        await asyncio.wait_for(asyncio.wrap_future(ready), self.start_timeout_s)
        rid, future = self.submit(op, **fields)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            try:
                self.submit("cancel", target=rid)
            except WorkerFailed:
                pass
            raise WorkerFailed(f"bridge request {op} timed out after {timeout:.0f}s") from None


class WorkerError(RuntimeError):
    """The worker answered the request with an error (it is still running)."""
