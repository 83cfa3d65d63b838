"""An OpenAI-compatible chat endpoint on 127.0.0.1 that answers from scripts.

`rlkit env check` plays scripted replies through an environment's own rollout. A native
environment takes a `ScriptedClient` object; a bridged (verifiers) environment's rollout runs in
a worker process that needs a URL, so its scripts are served here: each script is registered
under a fresh model name, and every `POST /v1/chat/completions` for that model gets the script's
next assistant message (the request's `model` field routes it, so concurrent cases never mix).
A request past the end of a script gets a 400 whose message says so, which fails the rollout the
way an engine error would.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NextMessage = Callable[[], dict[str, Any]]  # raises to refuse the request


def chat_completion(model: str, message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat completion holding one assistant message."""
    tool_calls = message.get("tool_calls")
    return {
        "id": f"chatcmpl-scripted-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": message.get("content") or ""}
                | ({"tool_calls": tool_calls} if tool_calls else {}),
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


class ScriptedServer:
    """Serves registered scripts (see the module docstring); a context manager."""

    def __init__(self) -> None:
        self.scripts: dict[str, NextMessage] = {}
        self.names = itertools.count()
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def register(self, next_message: NextMessage) -> str:
        """Serve `next_message()` to requests for the returned model name."""
        with self.lock:
            model = f"scripted-{next(self.names)}"
            self.scripts[model] = next_message
        return model

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        model = str(body.get("model"))
        with self.lock:
            next_message = self.scripts.get(model)
        if next_message is None:
            return 404, {"error": {"message": f"no script for model {model!r}"}}
        try:
            message = next_message()
        except Exception as exc:  # the script is exhausted: the rollout fails like on a 400
            return 400, {"error": {"message": str(exc), "type": "BadRequestError"}}
        return 200, chat_completion(model, message)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if self.path.rstrip("/").endswith("/chat/completions"):
                    status, data = server.reply(body)
                else:
                    status, data = 404, {"error": {"message": f"no route {self.path}"}}
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

        return Handler

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
