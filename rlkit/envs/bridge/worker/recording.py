"""The worker's recording HTTP layer, shared by the worker and the shims that build their own
verifiers clients (0.4's interception server relays model calls from a separate agent program).

`RecordingTransport` asks generation requests for token ids + logprobs and appends each reply,
as an rlkit turn, to the list in `CALLS` (the rollout that made the call sets it).
"""

from __future__ import annotations

import contextvars
import json
from typing import Any

import openai._base_client

# the HTTP library openai's client is built on: httpx2 for openai 3, httpx before
httpx: Any = getattr(openai._base_client, "httpx2", None) or openai._base_client.httpx
CALLS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "rlkit_bridge_calls", default=None
)
GENERATION_PATHS = ("/chat/completions", "/completions")


def _turn(body: dict[str, Any], data: dict[str, Any], start: int | None, end: int | None):
    """One rlkit turn from a generation request and the engine's reply."""
    choice = (data.get("choices") or [{}])[0]
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:  # chat
        lps = [float(item["logprob"]) for item in logprobs.get("content") or []]
        prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
    else:
        lps = [float(x) for x in logprobs.get("token_logprobs") or []]
        prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or []
    return {
        "prompt_token_ids": list(prompt_ids),
        "completion_token_ids": list(choice.get("token_ids") or []),
        "completion_logprobs": lps,
        "finish_reason": choice.get("finish_reason"),
        "temperature": body.get("temperature"),  # what the request was sampled at
        "policy_version_start": start,
        "policy_version_end": end,
        "usage": data.get("usage") or {},
    }


class RecordingTransport(httpx.AsyncBaseTransport):
    """Asks for token ids + logprobs on generation requests and records each reply as a turn."""

    def __init__(self, max_connections: int) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=64)
        self.inner = httpx.AsyncHTTPTransport(limits=limits)
        self.policy_version: int | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        calls = CALLS.get()
        if request.method != "POST" or not request.url.path.endswith(GENERATION_PATHS):
            return await self.inner.handle_async_request(request)
        await request.aread()
        body = json.loads(request.content or b"{}")
        chat = request.url.path.endswith("/chat/completions")
        # what the shims send themselves (the completions API takes a count of top logprobs)
        asked = {"logprobs": True if chat else body.get("logprobs") or 0, "return_token_ids": True}
        if any(body.get(key) != value for key, value in asked.items()):
            body.update(asked)
            headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
            request = httpx.Request(
                "POST", request.url, headers=headers, content=json.dumps(body).encode()
            )
        start = self.policy_version
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        await response.aclose()
        version = response.headers.get("x-policy-version")
        end = int(version) if version is not None else None
        if end is not None:
            self.policy_version = end
        if calls is not None and response.status_code < 400:
            try:
                calls.append(_turn(body, json.loads(content), start, end))
            except (ValueError, KeyError, TypeError):
                pass  # verifiers sees the same body and reports it
        headers = [
            (k, v)
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
        ]
        return httpx.Response(response.status_code, headers=headers, content=content)

    async def aclose(self) -> None:
        await self.inner.aclose()
