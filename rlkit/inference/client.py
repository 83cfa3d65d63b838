"""Async client for an OpenAI-compatible server (generation; admin calls: `rlkit.inference.admin`).

`InferenceClient.chat()` / `.completion()` return a `Generation` with the text, the prompt and
completion token ids and one logprob per completion token (vLLM's ``return_token_ids`` and
``logprobs``), and the policy versions current when the request was sent and when it finished.
`supports_token_prompts()` says whether the server takes token-id prompts (multi-turn rollouts
then carry token ids between turns): set explicitly, or probed once per model from the server's
model list, where vLLM (and only vLLM-like engines) report `max_model_len`.
Transient failures (connection errors, timeouts, 429 and 5xx) are retried with exponential
backoff; anything else raises `InferenceError` at once.

The transport is aiohttp: at hundreds of requests in flight the client's own CPU per request
bounds eval throughput on a small machine. `bench_eval_throughput.py` measures the client's CPU
per request (before and after the move from httpx: docs/benchmarks.md). Kept connections are
dropped before the server would close them and never reused once it has (`KeptConnector`).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from rlkit.connections import KeptConnector
from rlkit.errors import InferenceError
from rlkit.proxies import env_proxy

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
# an idle kept connection is dropped before vLLM's server closes it (VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
# 5 s), so no request is sent on one the server is closing (`rlkit.connections`)
KEEP_ALIVE_S = 4.0


@dataclass
class Response:
    """A whole HTTP response, read before the connection went back to the pool."""

    status_code: int
    headers: CIMultiDictProxy[str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


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
    # MoE: the experts the engine routed the prompt + completion tokens to (all but the last
    # sampled token), base64 .npy [tokens, layers, top_k]; None unless the client asks for it
    routed_experts: str | None = None


def _response_version(resp: Response, adapter: str | None = None) -> int | None:
    """The policy version the server reported when this response started: the server's, or
    with `adapter` that LoRA adapter's (from `X-Adapter-Versions`)."""
    if adapter is not None:
        versions = json.loads(resp.headers.get("x-adapter-versions") or "{}")
        return int(versions[adapter]) if adapter in versions else None
    version = resp.headers.get("x-policy-version")
    return int(version) if version is not None else None


def _logprobs_from_chat(choice: dict[str, Any]) -> list[float]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return [float(item["logprob"]) for item in content]


def _logprobs_from_completion(choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs") or {}
    return [float(x) for x in lp.get("token_logprobs") or []]


def _with_parent(card: dict[str, Any] | None, cards: list[dict[str, Any]]) -> dict | None:
    """A LoRA adapter's card completed from its base model's (vLLM lists adapters without
    `max_model_len`, and with the adapter directory as `root`, where no tokenizer lives)."""
    if card is None or card.get("max_model_len") is not None or not card.get("parent"):
        return card
    parent = next((c for c in cards if c.get("id") == card["parent"]), None)
    return card if parent is None else {**parent, "id": card["id"], "parent": card["parent"]}


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
        token_prompts: bool | None = None,
        adapter: str | None = None,
    ) -> None:
        self.api_key, self.timeout = api_key, timeout  # the bridge hands both to its workers
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_connections = max_connections
        self._proxy = env_proxy(self.base_url)
        self._session: aiohttp.ClientSession | None = None  # opened by the first request
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.policy_version: int | None = None  # last version this client saw
        # a LoRA run's adapter name: policy versions are that adapter's, weights load as it
        self.adapter = adapter
        self.token_prompts = token_prompts  # None: probe the server (see supports_token_prompts)
        self.routing = False  # attach each completion's routed experts (R3; see `routed_experts`)
        # one lookup per model, awaited by every rollout that asks (all wake together when it
        # ends; a lock would wake them one event-loop turn at a time: 256 turns for a first wave)
        self._cards: dict[str, asyncio.Task[dict[str, Any] | None]] = {}

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool, opened in the event loop that first uses this client."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=KeptConnector(
                    limit=self._max_connections, keepalive_timeout=KEEP_ALIVE_S
                ),
                proxy=self._proxy,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(
        self, method: str, path: str, timeout: float | None = None, **kwargs: Any
    ) -> Response:
        """One request, read whole; transport failures raise aiohttp's or asyncio's errors."""
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        async with self._http().request(method, self.base_url + path, **kwargs) as resp:
            return Response(resp.status, resp.headers, await resp.read())

    async def request(
        self, method: str, path: str, *, retries: int | None = None, **kwargs: Any
    ) -> Response:
        """Send with retries (`max_retries` unless given) on transient failures; raise
        InferenceError otherwise."""
        last: str = ""
        status: int | None = None
        retries = self.max_retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                resp = await self._send(method, path, **kwargs)
                version = _response_version(resp, self.adapter)
                if version is not None:
                    self.policy_version = version
                if resp.status_code < 400:
                    return resp
                status = resp.status_code
                last = f"HTTP {resp.status_code} from {path}: {resp.text[:500]}"
                if resp.status_code not in RETRY_STATUS:
                    break
            except TRANSPORT_ERRORS as exc:
                status = None
                last = f"{type(exc).__name__} talking to {self.base_url}{path}: {exc}"
            if attempt < retries:
                delay = self.backoff_s * (2**attempt) * (0.5 + random.random())
                await asyncio.sleep(min(delay, 30.0))
        raise InferenceError(last, status)

    # ---- health and capabilities -----------------------------------------------------------
    async def health(self) -> bool:
        """True when the server answers /health with 200 (no retries)."""
        try:
            return (await self._send("GET", "/health", timeout=5.0)).status_code == 200
        except TRANSPORT_ERRORS:
            return False

    async def models(self) -> list[str]:
        resp = await self.request("GET", "/v1/models")
        return [m["id"] for m in resp.json().get("data", [])]

    async def model_card(self, model: str) -> dict[str, Any] | None:
        """The server's `/v1/models` entry for `model`, or None; asked once (no retries)."""
        if model not in self._cards:
            self._cards[model] = asyncio.create_task(self._fetch_card(model))
        return await asyncio.shield(self._cards[model])  # one caller's cancellation is its own

    async def _fetch_card(self, model: str) -> dict[str, Any] | None:
        try:
            resp = await self._send("GET", "/v1/models", timeout=10.0)
            if resp.status_code == 200:
                cards = resp.json().get("data") or []
                card = next((c for c in cards if c.get("id") == model), None)
                return _with_parent(card, cards)
        except (*TRANSPORT_ERRORS, ValueError):
            pass
        return None

    async def supports_token_prompts(self, model: str) -> bool:
        """True when `completion()` may send token ids and get token ids + logprobs back."""
        if self.token_prompts is None:
            card = await self.model_card(model)
            return card is not None and card.get("max_model_len") is not None
        return self.token_prompts

    async def routing_source(self) -> str | None:
        """How this server returns routed experts: "vllm" (in every response), "capture"
        (rlkit's `/rlkit/routing` fallback) or None (it cannot, or is not an rlkit server)."""
        try:
            return (await self.request("GET", "/rlkit/status")).json().get("routing")
        except InferenceError as exc:
            if exc.status == 404:
                return None
            raise

    async def routed_experts(self, data: dict[str, Any], choice: dict[str, Any]) -> str | None:
        """The completion's routing when `self.routing`: vLLM's own field, else the capture."""
        if not self.routing:
            return None
        if choice.get("routed_experts"):
            return choice["routed_experts"]
        resp = await self.request("GET", f"/rlkit/routing/{data['id']}")
        return resp.json()["routed_experts"]

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
            policy_version_end=_response_version(resp, self.adapter),
            latency_s=loop.time() - t0,
            routed_experts=await self.routed_experts(data, choice),
        )

    async def completion(
        self,
        prompt: str | list[int],
        model: str,
        sampling: dict[str, Any] | None = None,
    ) -> Generation:
        """One text completion (prompt as text or token ids) with token ids and logprobs."""
        (generation,) = await self.completions(prompt, model, sampling, n=1)
        return generation

    async def completions(
        self,
        prompt: str | list[int],
        model: str,
        sampling: dict[str, Any] | None = None,
        n: int = 1,
    ) -> list[Generation]:
        """`n` samples of one prompt in one request, in choice order.

        vLLM prefills the prompt once and its API server handles one request instead of n, which
        on CPU costs more than generating a short completion. Each Generation's usage is its own
        (the prompt's tokens and its completion's), as if it had been requested alone.
        """
        if n > 1 and self.routing:
            raise ValueError("routing capture (R3) needs one completion per request")
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "logprobs": 0,
            "return_token_ids": True,
            **(sampling or {}),
        }
        if n > 1:
            body["n"] = n
        start_version = self.policy_version
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        resp = await self.request("POST", "/v1/completions", json=body)
        data = resp.json()
        choices = sorted(data["choices"], key=lambda choice: choice.get("index", 0))
        if len(choices) != n:
            raise InferenceError(f"asked for {n} completion(s), the server returned {len(choices)}")
        end_version, latency_s = _response_version(resp, self.adapter), loop.time() - t0
        usage = data.get("usage") or {}
        generations = []
        for choice in choices:
            token_ids = list(choice.get("token_ids") or [])
            own_usage = usage
            if n > 1:
                prompt_tokens = usage.get("prompt_tokens", 0)
                own_usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(token_ids),
                    "total_tokens": prompt_tokens + len(token_ids),
                }
            generations.append(
                Generation(
                    text=choice.get("text") or "",
                    prompt_token_ids=list(choice.get("prompt_token_ids") or []),
                    completion_token_ids=token_ids,
                    completion_logprobs=_logprobs_from_completion(choice),
                    finish_reason=choice.get("finish_reason"),
                    usage=own_usage,
                    policy_version_start=start_version,
                    policy_version_end=end_version,
                    latency_s=latency_s,
                    routed_experts=await self.routed_experts(data, choice),
                )
            )
        return generations
