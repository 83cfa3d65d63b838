"""A fake OpenAI-compatible server for tests: FastAPI + uvicorn on 127.0.0.1, vLLM-shaped replies.

It stands in for a *remote* API (rate limits, 5xx, latency) so eval and client code can be tested
without a model. Replies look like vLLM's: `prompt_token_ids`, per-choice `token_ids` and one
`logprobs.content` entry per completion token. Tokens are UTF-8 bytes (token id = byte value), so
token counts are easy to predict in tests.

    with FakeOpenAIServer(latency=0.1, fail_rate=0.2) as server:
        client = InferenceClient(server.url)   # server.url ends in /v1
        ...
        server.stats[429]                      # how many 429s were served

With `tokenizer=` (a transformers tokenizer, and `model_root=` the directory it was saved to) it
plays a vLLM server instead: chat prompts are rendered with the tokenizer's chat template, replies
are tokenized with it and end with its eos token, `/v1/models` reports `root` and
`max_model_len` (so clients send token-id prompts), and a prompt longer than `max_model_len` is
vLLM's 400.

The responder maps the request body to the reply: a string (assistant content) or a message dict
(`content`, optional `tool_calls`). The default reverses the last user message, so the
reverse-text environment scores 1.0. Run standalone (for benchmarks, in another process) with
``python -m tests.helpers.fake_openai --latency 1.0`` which prints its base URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

Responder = Callable[[dict[str, Any]], str | dict[str, Any]]


def _text_of(content: Any) -> str:
    """Message content as text (OpenAI allows a list of typed parts)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _sse(reply: dict[str, Any]) -> Iterable[str]:
    """A chat completion as the server-sent events of a stream (`stream: true`): the whole
    message in one delta (tool calls indexed), then the finish reason, then `[DONE]`."""
    choice = reply["choices"][0]
    delta = dict(choice["message"])
    if delta.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    head = {k: v for k, v in reply.items() if k not in ("choices", "usage")}
    chunk = {**head, "object": "chat.completion.chunk"}
    yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta}]})}\n\n"
    done = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
    last = {**chunk, "choices": [done], "usage": reply.get("usage")}
    yield f"data: {json.dumps(last)}\n\n"
    yield "data: [DONE]\n\n"


def reverse_last_user(body: dict[str, Any]) -> str:
    """Default responder: the last user message reversed (or the prompt reversed)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return _text_of(message.get("content"))[::-1]
    prompt = body.get("prompt", "")
    return prompt[::-1] if isinstance(prompt, str) else ""


def replay(scripts: dict[str, list[dict[str, Any]]]) -> Responder:
    """A responder playing one script per question (keyed by the first user message's text):
    the model's i-th message is `scripts[question][i]`, e.g. gold rollouts in benchmarks."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        question = next(_text_of(m.get("content")) for m in messages if m["role"] == "user")
        return scripts[question][sum(m["role"] == "assistant" for m in messages)]

    return respond


def _tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _logprob(token_id: int) -> float:
    """A deterministic, plausible logprob per token (tests only check shape and finiteness)."""
    return -0.05 - (token_id % 7) * 0.1


def _render_chat(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m.get('role')}|>{_text_of(m.get('content'))}\n" for m in messages)


class FakeOpenAIServer:
    """Context manager running the fake API in a background thread; `.url` is the /v1 base URL."""

    def __init__(
        self,
        responder: Responder = reverse_last_user,
        latency: float = 0.0,
        fail_rate: float = 0.0,
        fail_statuses: Iterable[int] = (429, 500),
        script: Iterable[int] = (),
        models: Iterable[str] = ("fake-model",),
        seed: int = 0,
        port: int = 0,
        tokenizer: Any = None,
        model_root: str | None = None,
        max_model_len: int = 4096,
    ) -> None:
        self.responder = responder
        self.tokenizer = tokenizer
        self.model_root = model_root
        self.max_model_len = max_model_len
        self.latency = latency
        self.fail_rate = fail_rate
        self.fail_statuses = list(fail_statuses)
        self.script = list(script)  # statuses returned by the first requests, in order
        self.models = list(models)
        self.rng = random.Random(seed)
        self.stats: Counter[int] = Counter()  # HTTP status -> count, generation routes only
        self.requests: list[dict[str, Any]] = []  # bodies of successful generation requests
        self.app = self._build_app()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(4096)  # connections wait in the backlog until the server accepts
        self.port: int = self._sock.getsockname()[1]
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ---- request handling -------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return _tokens(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _chat_prompt_ids(self, body: dict[str, Any]) -> list[int]:
        messages = body.get("messages") or []
        if self.tokenizer is None:
            return _tokens(_render_chat(messages))
        text = self.tokenizer.apply_chat_template(
            messages, tools=body.get("tools"), tokenize=False, add_generation_prompt=True
        )
        return self._encode(text)

    def _too_long(self, prompt_ids: list[int]) -> JSONResponse | None:
        """vLLM's 400 for a prompt over max_model_len (tokenizer mode only)."""
        if self.tokenizer is None or len(prompt_ids) <= self.max_model_len:
            return None
        message = (
            f"This model's maximum context length is {self.max_model_len} tokens. However, your "
            f"prompt contains {len(prompt_ids)} input tokens."
        )
        self.stats[400] += 1
        return JSONResponse({"error": {"message": message, "code": 400}}, status_code=400)

    def _token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return bytes([token_id]).decode("latin-1")
        return self.tokenizer.convert_ids_to_tokens(token_id)

    def _failure(self) -> int | None:
        if self.script:
            status = self.script.pop(0)
            return status if status >= 400 else None
        if self.fail_rate and self.rng.random() < self.fail_rate:
            return self.rng.choice(self.fail_statuses)
        return None

    async def _gate(self) -> JSONResponse | None:
        """Apply latency and injected failures; a response means 'fail with this'."""
        if self.latency:
            await asyncio.sleep(self.latency)
        status = self._failure()
        if status is None:
            return None
        self.stats[status] += 1
        error = {"message": f"injected failure {status}", "type": "fake", "code": status}
        return JSONResponse({"error": error}, status_code=status)

    def _reply(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[int], str]:
        """(assistant message, completion token ids, finish reason) for a request body."""
        out = self.responder(body)
        message = {"role": "assistant", "content": out} if isinstance(out, str) else dict(out)
        message.setdefault("role", "assistant")
        tool_calls = message.get("tool_calls") or []
        text = _text_of(message.get("content")) + "".join(
            f"<tool_call>{json.dumps(call['function'])}</tool_call>" for call in tool_calls
        )
        token_ids = self._encode(text)
        if self.tokenizer is not None:
            token_ids.append(self.tokenizer.eos_token_id)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        finish = "tool_calls" if tool_calls else "stop"
        if limit is not None and len(token_ids) > int(limit):
            token_ids = token_ids[: int(limit)]
            message["content"] = (
                bytes(token_ids).decode("utf-8", errors="ignore")
                if self.tokenizer is None
                else self.tokenizer.decode(token_ids)
            )
            message.pop("tool_calls", None)
            finish = "length"
        return message, token_ids, finish

    def _chat_reply(self, body: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
        message, token_ids, finish = self._reply(body)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs"):
            content = [
                {"token": self._token_text(t), "logprob": _logprob(t), "bytes": [t]}
                for t in token_ids
            ]
            choice["logprobs"] = {"content": [{**c, "top_logprobs": []} for c in content]}
        if body.get("return_token_ids"):
            choice["token_ids"] = token_ids
        return self._envelope(body, "chat.completion", [choice], prompt_ids, len(token_ids))

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            data: list[dict[str, Any]] = [
                {"id": m, "object": "model", "owned_by": "fake"} for m in self.models
            ]
            if self.tokenizer is not None:
                for card in data:
                    card.update(root=self.model_root, max_model_len=self.max_model_len)
            return {"object": "list", "data": data}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            if failed := await self._gate():
                return failed
            prompt_ids = self._chat_prompt_ids(body)
            if too_long := self._too_long(prompt_ids):
                return too_long
            reply = self._chat_reply(body, prompt_ids)
            if body.get("stream"):
                return StreamingResponse(_sse(reply), media_type="text/event-stream")
            return JSONResponse(reply)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            if failed := await self._gate():
                return failed
            prompt = body.get("prompt", "")
            prompt_ids = list(prompt) if isinstance(prompt, list) else self._encode(prompt)
            if too_long := self._too_long(prompt_ids):
                return too_long
            choices, generated = [], 0
            for index in range(int(body.get("n") or 1)):  # n samples: the responder once each
                message, token_ids, finish = self._reply(body)
                choice: dict[str, Any] = {
                    "index": index,
                    "text": message.get("content") or "",
                    "finish_reason": finish,
                }
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {
                        "tokens": [self._token_text(t) for t in token_ids],
                        "token_logprobs": [_logprob(t) for t in token_ids],
                        "top_logprobs": None,
                        "text_offset": list(range(len(token_ids))),
                    }
                if body.get("return_token_ids"):
                    choice["token_ids"] = token_ids
                    choice["prompt_token_ids"] = prompt_ids
                choices.append(choice)
                generated += len(token_ids)
            return JSONResponse(
                self._envelope(body, "text_completion", choices, prompt_ids, generated)
            )

        return app

    def _envelope(
        self,
        body: dict[str, Any],
        kind: str,
        choices: list[dict[str, Any]],
        prompt_ids: list[int],
        completion_tokens: int,
    ) -> dict[str, Any]:
        self.stats[200] += 1
        self.requests.append(body)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        }
        reply: dict[str, Any] = {
            "id": f"fake-{uuid.uuid4().hex[:12]}",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": choices,
            "usage": usage,
        }
        if body.get("return_token_ids") and kind == "chat.completion":
            reply["prompt_token_ids"] = prompt_ids
        return reply  # sent as JSONResponse: skips FastAPI's slow jsonable_encoder walk

    # ---- lifecycle --------------------------------------------------------------------------
    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", backlog=4096
        )

    def start(self) -> FakeOpenAIServer:
        self._server = uvicorn.Server(self._config())
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serve on the current (main) thread until SIGINT/SIGTERM; for standalone use."""
        uvicorn.Server(self._config()).run(sockets=[self._sock])

    # ---- lean mode: the same replies without FastAPI/uvicorn (benchmarks) -------------------
    def serve_lean_forever(self) -> None:
        """Serve /health, /v1/models and chat completions on plain asyncio streams.

        FastAPI + uvicorn's pure-Python HTTP cost a few ms of CPU per request, which on a
        shared machine caps what an eval client can be measured at. Latency only: no injected
        failures, HTTP/1.1 keep-alive, no pipelining.
        """
        if self.fail_rate or self.script:
            raise ValueError("lean mode injects no failures")
        asyncio.run(self._serve_lean())

    async def _serve_lean(self) -> None:
        server = await asyncio.start_server(self._lean_connection, sock=self._sock, backlog=4096)
        async with server:
            await server.serve_forever()

    async def _lean_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                length = 0
                for line in head[1:]:
                    if line[:15].lower() == "content-length:":
                        length = int(line[15:])
                body = json.loads(await reader.readexactly(length)) if length else {}
                status, reply = await self._lean_route(method, path, body)
                data = json.dumps(reply).encode()
                writer.write(
                    b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (status, len(data), data)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _lean_route(
        self, method: str, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path == "/health":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/v1/models":
            cards = [{"id": m, "object": "model", "owned_by": "fake"} for m in self.models]
            return 200, {"object": "list", "data": cards}
        if method == "POST" and path == "/v1/chat/completions":
            if self.latency:
                await asyncio.sleep(self.latency)
            return 200, self._chat_reply(body, self._chat_prompt_ids(body))
        return 404, {"error": {"message": f"lean fake server: no route {method} {path}"}}


def main() -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible server for tests.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--lean", action="store_true", help="plain asyncio HTTP (chat only)")
    args = parser.parse_args()
    server = FakeOpenAIServer(latency=args.latency, fail_rate=args.fail_rate, port=args.port)
    print(server.url, flush=True)
    if args.lean:
        server.serve_lean_forever()
    else:
        server.serve_forever()


if __name__ == "__main__":
    main()
