"""The client of `rlkit sandbox serve`: what `rlkit.sandbox.run` and `PythonSession` use when
a service is configured (`[sandbox] url` + `token_file`, or `RLKIT_SANDBOX_URL` +
`RLKIT_SANDBOX_TOKEN_FILE`).

Failures keep the in-process vocabulary: bad arguments (a 400) raise ValueError, a refused
credential raises SandboxUnavailable, and a service that is unreachable, dies mid-request or
stays busy past the caller's wait gives a `sandbox_error` result (the infrastructure failed,
not the program), so a rollout errors and the run goes on instead of hanging. A 429 is retried
after its Retry-After until `max_queue_s` has passed.

The transport is aiohttp, as for the inference client: httpx's own overhead was most of a warm
request's HTTP time (`bench_sandbox_service.py`, docs/benchmarks.md). Connections are kept alive
in one session per running event loop, closed when that loop is shut down (`asyncio.run` per
grading call included): a connection per call was a large part of a warm request's HTTP time.
A kept connection the service has closed (it restarted) is dropped before a request is sent on
it (`KeptConnector`); a request that fails once sent is not sent again (see there).

Several services (`[sandbox] service_urls`, or `url` / `RLKIT_SANDBOX_URL` naming several,
comma-separated; one token file for all): each `/run` goes to the service with the fewest of
this client's requests in flight among those not marked down, and one whose service cannot be
reached or dies before answering is sent to the next (a program is a pure function of its
inputs: running it again elsewhere changes nothing but where); a service that failed is passed
over for `DOWN_S`. A session stays on the service that opened it (its state lives there): that
service failing fails the session (`call_at`), which the session reports as lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from rlkit.connections import KeptConnector
from rlkit.errors import SystemRequirementError
from rlkit.protocol.credentials import read_token
from rlkit.proxies import env_proxy
from rlkit.sandbox.result import SandboxResult
from rlkit.sandbox.wire import DEFAULT_MAX_QUEUE_S, encode_files

# Beyond a request's own timeout and queue wait: start, transfer and a loaded host.
RESPONSE_SLACK_S = 30.0
MAX_CONNECTIONS = 256  # open at once per event loop (a burst of rollouts stays under the fd limit)
# An idle connection is dropped before the service would close it (`service.KEEP_ALIVE_S`), so a
# request is never sent on a connection the service is closing.
KEEP_ALIVE_S = 30.0
# How long a service that could not be reached (or died mid-request) is passed over.
DOWN_S = 5.0


class ServiceError(Exception):
    """The service could not answer (unreachable, died, busy too long, a server error)."""


BUSY = "busy past the caller's max_queue_s"  # how a ServiceError for a busy service ends


class ServiceRefused(SystemRequirementError):
    """The service refused the credential (401/403)."""


def service_urls(url: str) -> list[str]:
    """The services `url` names: one, or several separated by commas."""
    urls = [part.strip().rstrip("/") for part in url.split(",") if part.strip()]
    if not urls:
        raise ValueError(f"no sandbox service URL in {url!r}")
    return urls


class SandboxClient:
    """Talks to one service or spreads requests over several (`url`: comma-separated)."""

    def __init__(self, url: str, token_file: str, max_queue_s: float = DEFAULT_MAX_QUEUE_S):
        self.urls = service_urls(url)
        self.url = self.urls[0]
        self._headers = {"Authorization": f"Bearer {read_token(token_file)}"}
        self.max_queue_s = max_queue_s
        self._proxies = {base: env_proxy(base) for base in self.urls}
        self.in_flight = dict.fromkeys(self.urls, 0)  # this client's requests at each service
        self._down_until = dict.fromkeys(self.urls, 0.0)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        # each loop's closer: an async generator, which the loop finalises when it shuts down
        self._closers: dict[asyncio.AbstractEventLoop, AsyncIterator[None]] = {}

    async def _session(self) -> aiohttp.ClientSession:
        """This event loop's session, made on its first call."""
        loop = asyncio.get_running_loop()
        http = self._sessions.get(loop)
        if http is None or http.closed:
            for other in [other for other in self._sessions if other.is_closed()]:
                del self._sessions[other], self._closers[other]  # a loop closed without shutdown
            connector = KeptConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEP_ALIVE_S)
            http = aiohttp.ClientSession(headers=self._headers, connector=connector)
            self._sessions[loop] = http
            self._closers[loop] = self._close_with_loop(loop, http)
            await anext(self._closers[loop])
        return http

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, http: aiohttp.ClientSession
    ) -> AsyncIterator[None]:
        """Suspended until its loop shuts its async generators down, then closes `http`."""
        try:
            yield
        finally:
            self._sessions.pop(loop, None)
            self._closers.pop(loop, None)
            await http.close()

    async def _send(
        self,
        http: aiohttp.ClientSession,
        base: str,
        method: str,
        path: str,
        body: dict | None,
        timeout: aiohttp.ClientTimeout,
    ) -> tuple[int, str, bytes]:
        """One HTTP exchange with the service at `base`: status, Retry-After and the body."""
        try:
            async with http.request(
                method, base + path, json=body, timeout=timeout, proxy=self._proxies[base]
            ) as answer:
                return answer.status, answer.headers.get("retry-after", "1"), await answer.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._down_until[base] = time.monotonic() + DOWN_S
            raise ServiceError(f"sandbox service {base}: {type(exc).__name__}: {exc}") from None

    def ranked(self) -> list[str]:
        """The services in the order to try them: those not marked down first, each group by
        this client's requests in flight there (fewest first)."""
        now = time.monotonic()
        return sorted(self.urls, key=lambda u: (self._down_until[u] > now, self.in_flight[u]))

    async def call(self, method: str, path: str, body: dict | None, work_s: float) -> Any:
        """A request that any service may answer (a program): to the least loaded, and to the
        next when one cannot be reached or dies before answering."""
        failures = []
        for base in self.ranked():
            try:
                return await self.call_at(base, method, path, body, work_s)
            except ServiceError as exc:
                if str(exc).endswith(BUSY):
                    raise
                failures.append(str(exc))
        raise ServiceError("; ".join(failures))

    async def open_at(self, method: str, path: str, body: dict | None, work_s: float):
        """Like `call`, and which service answered (a session lives there): (base, answer)."""
        failures = []
        for base in self.ranked():
            try:
                return base, await self.call_at(base, method, path, body, work_s)
            except ServiceError as exc:
                failures.append(str(exc))
        raise ServiceError("; ".join(failures))

    async def call_at(
        self, base: str, method: str, path: str, body: dict | None, work_s: float
    ) -> Any:
        """One request to the service at `base`, 429s retried until the caller's queue wait is
        spent."""
        deadline = time.monotonic() + self.max_queue_s
        timeout = aiohttp.ClientTimeout(
            total=work_s + self.max_queue_s + RESPONSE_SLACK_S, sock_connect=10.0
        )
        http = await self._session()
        self.in_flight[base] += 1
        try:
            while True:
                status, retry_after, content = await self._send(
                    http, base, method, path, body, timeout
                )
                if status != 429:
                    break
                wait = float(retry_after)
                if time.monotonic() + wait > deadline:
                    raise ServiceError(f"sandbox service {base} {BUSY}")
                await asyncio.sleep(wait)
        finally:
            self.in_flight[base] -= 1
        try:
            answer = json.loads(content)
        except ValueError:
            answer = {"error": content[:500].decode(errors="replace")}
        if status in (401, 403):
            raise ServiceRefused(f"sandbox service {base}: {answer.get('error')}")
        if status in (400, 413):
            raise ValueError(f"sandbox service: {answer.get('error')}")
        if status == 404:
            raise KeyError(answer.get("error"))
        if status != 200:
            raise ServiceError(f"sandbox service {base}: HTTP {status}")
        return answer

    async def run(
        self,
        code: str,
        language: str,
        stdin: str,
        timeout: float,
        memory_mb: int,
        files: dict[str, str | bytes] | None,
    ) -> SandboxResult:
        body = {
            "code": code,
            "language": language,
            "stdin": stdin,
            "timeout": timeout,
            "memory_mb": memory_mb,
            "files": encode_files(files),
            "max_queue_s": self.max_queue_s,
        }
        try:
            return SandboxResult.model_validate(await self.call("POST", "/run", body, timeout))
        except ServiceError as exc:
            return SandboxResult(status="sandbox_error", stderr=str(exc))
