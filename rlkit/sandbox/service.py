"""`rlkit sandbox serve`: the sandbox as an HTTP service, for every process of a run (or other
machines) to share one pool, one concurrency limit and one set of metrics.

Routes (JSON only; every one but `GET /health` needs `Authorization: Bearer TOKEN`, checked
before the body is read, as on `rlkit infer`): `POST /run` (a program in a fresh sandbox:
`rlkit.sandbox.run`'s arguments, a `SandboxResult` back), `POST /sessions`,
`POST /sessions/{id}/execute`, `DELETE /sessions/{id}` (a `PythonSession` kept on the service,
usable only by the caller that opened it, closed after `session_idle_s` unused), `GET /metrics`
(the whole service's counts, for the owner and every tenant alike: no route is the owner's
alone). The token check and the error body are `rlkit.serving`'s; no rule of another service
applies here.

Backpressure: at most `concurrency` programs or cells run at once and at most `queue` requests
wait for a slot; beyond that, or after a request's `max_queue_s` of waiting, the answer is 429
with `Retry-After`. A request over the service's limits (timeout, memory, body size) is a 400 or
413 that names the limit. Programs run in warm sandboxes (`rlkit.sandbox.pool`), one per request;
the pools are refilled after each request (scheduled as its answer goes out). Under bubblewrap
each warm sandbox is forked by a fork server (`rlkit.sandbox.forkserver`: fresh namespaces,
tmpfs and process per request, as a sandbox of its own), so a refill costs a fork, not a
bubblewrap and interpreter start (`--no-fork-server` starts one per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rlkit.sandbox.backends import Bwrap
from rlkit.sandbox.forkserver import ForkPool
from rlkit.sandbox.launch import check_names
from rlkit.sandbox.pool import Profile, WarmPool
from rlkit.sandbox.runner import SandboxSettings, checked_backend
from rlkit.sandbox.session import PythonSession
from rlkit.sandbox.wire import CellRequest, RunRequest, SessionRequest, decode_files
from rlkit.serving import (
    Credentials,
    RequireToken,
    ServiceError,
    caller,
    error_response,
    guarded_uvicorn_options,
    raise_descriptor_limit,
)

# How long an idle client connection is kept open: longer than the client keeps it
# (`client.KEEP_ALIVE_S`), so the client always drops an idle connection first.
KEEP_ALIVE_S = 60
# How long an authenticated caller may take to send a request's body.
BODY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServiceSettings:
    """What one service allows and keeps ready."""

    # what every shipped environment asks at most (the code env: 6 tests x 5.5 s + 5 s = 38 s)
    profiles: tuple[Profile, ...] = (Profile(timeout=60.0, memory_mb=1024),)
    pool_size: int = 4  # warm sandboxes kept ready per profile
    concurrency: int = 4  # programs and cells running at once
    queue: int = 256  # requests waiting for a slot at most; more get 429
    max_request_bytes: int = 16 << 20
    max_sessions: int = 256
    max_sessions_per_caller: int = 32  # one caller (token) cannot take every session
    session_idle_s: float = 300.0
    max_session_cpu_s: float = 600.0  # a session's CPU time over its whole life, at most
    # warm sandboxes forked by fork servers (`rlkit.sandbox.forkserver`; bubblewrap only)
    # instead of a bubblewrap and interpreter start each
    fork_server: bool = True
    # the backend, total memory cap and output cap of the service's own sandboxes (its url is
    # unused: the service runs them here)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings.from_env)


class Busy(ServiceError):
    """No slot now and the queue is full (or the wait ran out), or the caller holds its share of
    sessions: 429 with Retry-After."""

    def __init__(self, retry_after: int, message: str = "") -> None:
        message = message or "sandbox service busy: retry later"
        super().__init__(429, message, headers={"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class Refused(ServiceError):
    """A request the service will not run (over its limits, malformed): 400 / 413; a session
    that is not the caller's: 404."""


@dataclass
class Admission:
    """The concurrency limit with its bounded queue, and what waiting cost."""

    concurrency: int
    queue: int
    waiting: int = 0
    running: int = 0
    rejected: int = 0
    waits: int = 0  # requests that had to wait for a slot
    wait_s_total: float = 0.0
    wait_s_max: float = 0.0
    durations: list[float] = field(default_factory=list)  # recent run times, for Retry-After
    _slots: asyncio.Semaphore | None = None

    def retry_after(self) -> int:
        mean = sum(self.durations) / len(self.durations) if self.durations else 1.0
        return max(1, math.ceil(mean * (self.waiting + 1) / self.concurrency))

    @contextlib.asynccontextmanager
    async def slot(self, max_wait: float) -> AsyncIterator[None]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        slots = self._slots
        began = time.monotonic()
        if slots.locked():
            if self.waiting >= self.queue:
                self.rejected += 1
                raise Busy(self.retry_after())
            self.waiting += 1
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                async with asyncio.timeout(max_wait):
                    await slots.acquire()
            except TimeoutError:
                self.rejected += 1
                raise Busy(self.retry_after()) from None
            finally:
                self.waiting -= 1
            self.waits += 1
        else:
            await slots.acquire()  # free: returns at once
        waited = time.monotonic() - began
        self.wait_s_total += waited
        self.wait_s_max = max(self.wait_s_max, waited)
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.durations = [*self.durations[-99:], time.monotonic() - began - waited]
            slots.release()


@dataclass
class Hosted:
    """A session kept on the service for the caller that opened it."""

    session: PythonSession
    owner: str
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False


class SandboxService:
    """The service's state: pools, admission, sessions and counters."""

    def __init__(self, config: ServiceSettings) -> None:
        self.config = config
        backend = checked_backend(config.sandbox.backend)  # fails closed before the port opens
        pool_class = ForkPool if config.fork_server and type(backend) is Bwrap else WarmPool
        self.pools = [pool_class(p, config.pool_size, backend) for p in config.profiles]
        self.admission = Admission(config.concurrency, config.queue)
        self.sessions: dict[str, Hosted] = {}
        self.counts = {"runs": 0, "cells": 0, "sandbox_errors": 0, "sessions_expired": 0}
        self._expiry: asyncio.Task | None = None

    async def start(self) -> None:
        for pool in self.pools:
            pool.fill()
        self._expiry = asyncio.ensure_future(self._expire_sessions())

    def refill(self) -> None:
        """Start sandboxes until every pool is full again (in the background)."""
        for pool in self.pools:
            pool.fill()

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for pool in self.pools:
            await pool.close()
        for hosted in list(self.sessions.values()):
            await hosted.session.close()
        self.sessions.clear()

    def _pool_for(self, timeout: float, memory_mb: int) -> WarmPool:
        for pool in sorted(self.pools, key=lambda p: (p.profile.memory_mb, p.profile.timeout)):
            if pool.profile.covers(timeout, memory_mb):
                return pool
        most = max(self.pools, key=lambda p: (p.profile.memory_mb, p.profile.timeout)).profile
        raise Refused(
            400,
            f"over the service's limits: timeout {timeout} s / memory_mb {memory_mb} "
            f"(at most {most.timeout} s and {most.memory_mb} MiB)",
        )

    async def run(self, request: RunRequest) -> dict[str, Any]:
        pool = self._pool_for(request.timeout, request.memory_mb)
        try:
            files = decode_files(request.files)
            check_names(files)  # before a sandbox is taken: a refusal costs none
            run_limits = self.config.sandbox.limits(request.timeout, request.memory_mb)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        async with self.admission.slot(request.max_queue_s):
            sandbox = await pool.take()
            self.counts["runs"] += 1
            if sandbox is None:
                self.counts["sandbox_errors"] += 1
                return {"status": "sandbox_error", "stderr": "the sandbox did not start"}
            try:
                result = await sandbox.run(
                    request.code,
                    request.language,
                    request.stdin,
                    files,
                    run_limits,
                    self.config.sandbox.output_limit,
                )
            except ValueError as exc:  # refused after all: the sandbox is discarded
                self.refill()
                raise Refused(400, str(exc)) from None
        if result.status == "sandbox_error":
            self.counts["sandbox_errors"] += 1
        return result.model_dump()

    def open_session(self, request: SessionRequest, owner: str) -> dict[str, Any]:
        self._pool_for(request.timeout, request.memory_mb)  # the same limits as programs
        cap = self.config.sandbox.output_limit  # a cell's output is held here: the caller's cap
        if request.output_limit > cap:  # alone would let it fill the service's memory
            raise Refused(
                400, f"output_limit {request.output_limit} over the service's limit of {cap} bytes"
            )
        if request.lifetime_cpu_s > self.config.max_session_cpu_s:
            raise Refused(
                400,
                f"lifetime_cpu_s {request.lifetime_cpu_s} over the service's limit of "
                f"{self.config.max_session_cpu_s} s",
            )
        wait = max(1, int(self.config.session_idle_s))
        if len(self.sessions) >= self.config.max_sessions:
            raise Busy(wait)
        mine = sum(hosted.owner == owner for hosted in self.sessions.values())
        if mine >= self.config.max_sessions_per_caller:
            raise Busy(
                wait,
                f"this caller has {mine} open sessions, the service's limit per caller: close "
                "one (DELETE /sessions/ID) or wait for an idle one to expire",
            )
        try:
            files = decode_files(request.files)
            check_names(files)
            session = PythonSession(
                timeout=request.timeout,
                memory_mb=request.memory_mb,
                output_limit=request.output_limit,
                lifetime_cpu_s=request.lifetime_cpu_s,
                files=files,
                sandbox=self.config.sandbox,
            )
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        session_id = secrets.token_urlsafe(24)
        self.sessions[session_id] = Hosted(session, owner)
        return {"id": session_id}

    def _owned(self, session_id: str, owner: str) -> Hosted:
        hosted = self.sessions.get(session_id)
        if hosted is None or hosted.owner != owner:
            raise Refused(404, "no such session (closed, expired, or another caller's)")
        return hosted

    async def execute(self, session_id: str, request: CellRequest, owner: str) -> dict[str, Any]:
        hosted = self._owned(session_id, owner)
        timeout = request.timeout or hosted.session.timeout
        self._pool_for(timeout, hosted.session.limits.memory_mb)
        async with self.admission.slot(request.max_queue_s):
            hosted.busy = True
            try:
                result = await hosted.session.execute(request.code, request.timeout)
            except asyncio.CancelledError:  # its caller went away mid-cell: the session ends
                self.sessions.pop(session_id, None)
                await asyncio.shield(hosted.session.close())
                raise
            finally:
                hosted.busy = False
                hosted.last_used = time.monotonic()
        self.counts["cells"] += 1
        if result.status == "sandbox_error":
            self.counts["sandbox_errors"] += 1
        return result.model_dump()

    async def close_session(self, session_id: str, owner: str) -> None:
        hosted = self._owned(session_id, owner)
        del self.sessions[session_id]
        await hosted.session.close()

    async def _expire_sessions(self) -> None:
        period = max(0.5, min(5.0, self.config.session_idle_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for session_id, hosted in list(self.sessions.items()):
                if not hosted.busy and now - hosted.last_used > self.config.session_idle_s:
                    del self.sessions[session_id]
                    self.counts["sessions_expired"] += 1
                    await hosted.session.close()

    def metrics(self) -> dict[str, Any]:
        adm = self.admission
        return {
            "pools": [
                {
                    "timeout": pool.profile.timeout,
                    "memory_mb": pool.profile.memory_mb,
                    "size": pool.size,
                    "ready": len(pool.ready),
                    "starting": pool.starting,
                    "warm_starts": pool.stats.warm_starts,
                    "cold_starts": pool.stats.cold_starts,
                    "start_failures": pool.stats.start_failures,
                    "start_s_mean": _mean(pool.stats.start_seconds),
                }
                for pool in self.pools
            ],
            "concurrency": adm.concurrency,
            "running": adm.running,
            "waiting": adm.waiting,
            "queue": adm.queue,
            "rejected": adm.rejected,
            "waits": adm.waits,
            "wait_s_mean": adm.wait_s_total / adm.waits if adm.waits else 0.0,
            "wait_s_max": adm.wait_s_max,
            "sessions": len(self.sessions),
            **self.counts,
        }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


async def _body(request: Request, model: type[BaseModel]) -> Any:
    """The request's JSON body as `model`, read up to the service's cap (413 beyond)."""
    cap = _service(request).config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise Refused(413, f"request body over the service's limit of {cap} bytes")
    data = bytearray()
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):  # a trickled body holds no slot for long
            async for chunk in request.stream():
                data += chunk
                if len(data) > cap:
                    raise Refused(413, f"request body over the service's limit of {cap} bytes")
    except TimeoutError:
        raise Refused(408, f"request body not received within {BODY_TIMEOUT_S:.0f} s") from None
    try:
        return model.model_validate_json(bytes(data))
    except ValidationError as exc:
        raise Refused(400, f"bad request: {exc.errors(include_url=False)}") from None


def _service(request: Request) -> SandboxService:
    return request.app.state.service


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


async def _while_connected(request: Request, work: Any) -> Any:
    """`work`'s result, or, when the caller goes away first (its connection closed: killed,
    timed out), `work` cancelled, which kills its sandbox (`process.supervise`), and no answer."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise Refused(499, "the caller went away")  # nobody reads this answer
    return task.result()


async def run(request: Request) -> JSONResponse:
    service = _service(request)
    body = await _body(request, RunRequest)
    try:
        result = await _while_connected(request, service.run(body))
    finally:
        service.refill()  # scheduled only: the starts run once this answer is on its way
    return JSONResponse(result)


async def open_session(request: Request) -> JSONResponse:
    body = await _body(request, SessionRequest)
    return JSONResponse(_service(request).open_session(body, caller(request).name))


async def execute(request: Request) -> JSONResponse:
    body = await _body(request, CellRequest)
    sid = request.path_params["sid"]
    work = _service(request).execute(sid, body, caller(request).name)
    return JSONResponse(await _while_connected(request, work))


async def close_session(request: Request) -> JSONResponse:
    await _service(request).close_session(request.path_params["sid"], caller(request).name)
    return JSONResponse({"closed": True})


async def metrics(request: Request) -> JSONResponse:
    """Every caller's, the owner's and each tenant's: counts of the whole service, no names."""
    return JSONResponse(_service(request).metrics())


# The sandbox's own rules: every route but /health needs a token (the owner's or a tenant's),
# none is the owner's alone; sessions are kept apart by caller inside the service.
ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/run", run, methods=["POST"]),
    Route("/sessions", open_session, methods=["POST"]),
    Route("/sessions/{sid}/execute", execute, methods=["POST"]),
    Route("/sessions/{sid}", close_session, methods=["DELETE"]),
    Route("/metrics", metrics, methods=["GET"]),
]
PUBLIC_PATHS = frozenset({"/health"})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    await app.state.service.start()
    try:
        yield
    finally:
        await app.state.service.stop()


def build_app(service: SandboxService, credentials: Credentials) -> Any:
    """The ASGI app: `ROUTES` behind the token check (`rlkit.serving.RequireToken`), refusals
    answered as `{"error": ...}` (`rlkit.serving.error_response`)."""
    app = Starlette(
        routes=ROUTES, lifespan=lifespan, exception_handlers={ServiceError: error_response}
    )
    app.state.service = service
    return RequireToken(app, credentials, public=PUBLIC_PATHS)


def serve(host: str, port: int, credentials: Credentials, config: ServiceSettings) -> None:
    """Run the service until interrupted (uvicorn, one process, one event loop).

    The loop is asyncio's, not uvloop: uvloop starts a sandbox with fork(), which copies this
    process's page tables for every start (most of a start's CPU, docs/benchmarks.md), asyncio
    with vfork()."""
    import uvicorn

    raise_descriptor_limit()  # connections and sandbox pipes (a sandbox sets its own limit)
    service = SandboxService(config)
    uvicorn.run(
        build_app(service, credentials),
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_S,
        loop="asyncio",
        access_log=False,  # nothing logged per request (log_level alone still asks the logger)
        proxy_headers=False,  # no client address is used: X-Forwarded-* is not parsed at all
        **guarded_uvicorn_options(),  # header time and size, connections: before any token
    )
