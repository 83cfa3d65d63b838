"""The client of `rlkit sandbox serve`: what `rlkit.sandbox.run` and `PythonSession` use when
a service is configured (`[sandbox] url` + `token_file`, or `RLKIT_SANDBOX_URL` +
`RLKIT_SANDBOX_TOKEN_FILE`).

Failures keep the in-process vocabulary: bad arguments (a 400) raise ValueError, a refused
credential raises SandboxUnavailable, and a service that is unreachable, dies mid-request or
stays busy past the caller's wait gives a `sandbox_error` result (the infrastructure failed,
not the program), so a rollout errors and the run goes on instead of hanging. A 429 is retried
after its Retry-After until `max_queue_s` has passed.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

import httpx

from rlkit.errors import SystemRequirementError
from rlkit.protocol.credentials import read_token
from rlkit.sandbox.result import SandboxResult
from rlkit.sandbox.wire import DEFAULT_MAX_QUEUE_S, encode_files

# Beyond a request's own timeout and queue wait: start, transfer and a loaded host.
RESPONSE_SLACK_S = 30.0
MAX_CONNECTIONS = 256


class ServiceError(Exception):
    """The service could not answer (unreachable, died, busy too long, a server error)."""


class ServiceRefused(SystemRequirementError):
    """The service refused the credential (401/403)."""


class SandboxClient:
    """Talks to one service; one HTTP connection pool per event loop."""

    def __init__(self, url: str, token_file: str, max_queue_s: float = DEFAULT_MAX_QUEUE_S):
        self.url = url.rstrip("/")
        self.token = read_token(token_file)
        self.max_queue_s = max_queue_s
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = httpx.AsyncClient(
                base_url=self.url,
                headers={"Authorization": f"Bearer {self.token}"},
                limits=httpx.Limits(max_connections=MAX_CONNECTIONS),
            )
        return self._clients[loop]

    async def call(self, method: str, path: str, body: dict | None, work_s: float) -> Any:
        """One request, 429s retried until the caller's queue wait is spent."""
        deadline = time.monotonic() + self.max_queue_s
        timeout = httpx.Timeout(work_s + self.max_queue_s + RESPONSE_SLACK_S, connect=10.0)
        while True:
            try:
                response = await self._client().request(method, path, json=body, timeout=timeout)
            except httpx.HTTPError as exc:
                raise ServiceError(
                    f"sandbox service {self.url}: {type(exc).__name__}: {exc}"
                ) from None
            if response.status_code == 429:
                wait = float(response.headers.get("retry-after", "1"))
                if time.monotonic() + wait > deadline:
                    raise ServiceError(f"sandbox service {self.url} busy past {self.max_queue_s}s")
                await asyncio.sleep(wait)
                continue
            try:
                answer = response.json()
            except ValueError:
                answer = {"error": response.text[:500]}
            if response.status_code in (401, 403):
                raise ServiceRefused(f"sandbox service {self.url}: {answer.get('error')}")
            if response.status_code in (400, 413):
                raise ValueError(f"sandbox service: {answer.get('error')}")
            if response.status_code == 404:
                raise KeyError(answer.get("error"))
            if response.status_code != 200:
                raise ServiceError(f"sandbox service {self.url}: HTTP {response.status_code}")
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

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
