"""Async client for an OpenAI-compatible server, plus rlkit's weight-sync routes.

`InferenceClient.chat()` / `.completion()` return a `Generation` with the text, the prompt and
completion token ids and one logprob per completion token (vLLM's ``return_token_ids`` and
``logprobs``), and the policy versions current when the request was sent and when it finished.
Transient failures (connection errors, timeouts, 429 and 5xx) are retried with exponential
backoff; anything else raises `InferenceError` at once.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
CONNECTIONS_PER_POOL = 32


class InferenceError(RuntimeError):
    """A request failed for good (after retries, or a non-retryable status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Generation:
    """One model turn as the engine produced it."""

    text: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str | None
    message: dict[str, Any] = field(default_factory=dict)  # assistant message (tool calls etc.)
    usage: dict[str, int] = field(default_factory=dict)
    policy_version_start: int | None = None
    policy_version_end: int | None = None
    latency_s: float = 0.0


def _response_version(resp: httpx.Response) -> int | None:
    """The policy version the server reported when this response started."""
    version = resp.headers.get("x-policy-version")
    return int(version) if version is not None else None


def _logprobs_from_chat(choice: dict[str, Any]) -> list[float]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return [float(item["logprob"]) for item in content]


def _logprobs_from_completion(choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs") or {}
    return [float(x) for x in lp.get("token_logprobs") or []]


class InferenceClient:
    """One server. Safe to share across tasks; create inside the event loop that uses it."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_connections: int = 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx's pool does work proportional to its size on every request event, which
        # dominates at hundreds of connections; several small pools keep that cost flat.
        shards = max(1, -(-max_connections // CONNECTIONS_PER_POOL))
        per_shard = -(-max_connections // shards)
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        self._shards = [
            httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=timeout, limits=limits
            )
            for _ in range(shards)
        ]
        self._next_shard = itertools.cycle(self._shards)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.policy_version: int | None = None  # last version this client saw

    async def aclose(self) -> None:
        await asyncio.gather(*(shard.aclose() for shard in self._shards))

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send with retries on transient failures; raise InferenceError otherwise."""
        last: str = ""
        status: int | None = None
        for attempt in range(self.max_retries + 1):
            try:
                resp = await next(self._next_shard).request(method, path, **kwargs)
                version = _response_version(resp)
                if version is not None:
                    self.policy_version = version
                if resp.status_code < 400:
                    return resp
                status = resp.status_code
                last = f"HTTP {resp.status_code} from {path}: {resp.text[:500]}"
                if resp.status_code not in RETRY_STATUS:
                    break
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                status = None
                last = f"{type(exc).__name__} talking to {self.base_url}{path}: {exc}"
            if attempt < self.max_retries:
                delay = self.backoff_s * (2**attempt) * (0.5 + random.random())
                await asyncio.sleep(min(delay, 30.0))
        raise InferenceError(last, status)

    # ---- health and weight sync -------------------------------------------------------------
    async def health(self) -> bool:
        """True when the server answers /health with 200 (no retries)."""
        try:
            resp = await self._shards[0].get("/health", timeout=5.0)
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    async def status(self) -> dict[str, Any]:
        resp = await self.request("GET", "/rlkit/status")
        data = resp.json()
        self.policy_version = int(data["policy_version"])
        return data

    async def pause(self, mode: str = "keep") -> None:
        """Pause generation; with `keep` in-flight requests freeze and continue on resume."""
        await self.request("POST", "/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self.request("POST", "/resume")

    async def update_weights(self, path: str, version: int | None = None) -> int:
        """Load HF safetensors from `path` in place; returns the new policy version."""
        body: dict[str, Any] = {"path": str(path)}
        if version is not None:
            body["version"] = version
        resp = await self.request("POST", "/rlkit/update_weights", json=body)
        self.policy_version = int(resp.json()["policy_version"])
        return self.policy_version

    async def models(self) -> list[str]:
        resp = await self.request("GET", "/v1/models")
        return [m["id"] for m in resp.json().get("data", [])]

    # ---- generation -------------------------------------------------------------------------
    async def chat(
        self,
        messages: list[dict[str, Any]],
        model: str,
        sampling: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Generation:
        """One chat completion with token ids and per-token logprobs."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "logprobs": True,
            "return_token_ids": True,
            **(sampling or {}),
        }
        if tools:
            body["tools"] = tools
        start_version = self.policy_version
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        resp = await self.request("POST", "/v1/chat/completions", json=body)
        data = resp.json()
        choice = data["choices"][0]
        message = choice.get("message") or {}
        return Generation(
            text=message.get("content") or "",
            prompt_token_ids=list(
                data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
            ),
            completion_token_ids=list(choice.get("token_ids") or []),
            completion_logprobs=_logprobs_from_chat(choice),
            finish_reason=choice.get("finish_reason"),
            message=message,
            usage=data.get("usage") or {},
            policy_version_start=start_version,
            policy_version_end=_response_version(resp),
            latency_s=loop.time() - t0,
        )

    async def completion(
        self,
        prompt: str | list[int],
        model: str,
        sampling: dict[str, Any] | None = None,
    ) -> Generation:
        """One text completion (prompt as text or token ids) with token ids and logprobs."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "logprobs": 0,
            "return_token_ids": True,
            **(sampling or {}),
        }
        start_version = self.policy_version
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        resp = await self.request("POST", "/v1/completions", json=body)
        data = resp.json()
        choice = data["choices"][0]
        return Generation(
            text=choice.get("text") or "",
            prompt_token_ids=list(choice.get("prompt_token_ids") or []),
            completion_token_ids=list(choice.get("token_ids") or []),
            completion_logprobs=_logprobs_from_completion(choice),
            finish_reason=choice.get("finish_reason"),
            usage=data.get("usage") or {},
            policy_version_start=start_version,
            policy_version_end=_response_version(resp),
            latency_s=loop.time() - t0,
        )
