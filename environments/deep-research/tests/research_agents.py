"""Scripted models for the fake OpenAI server: replay fixed assistant messages turn by turn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def call(name: str, call_id: str = "c0", **arguments: Any) -> dict[str, Any]:
    """An assistant message with one tool call."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    tool_call = {"id": call_id, "type": "function", "function": function}
    return {"content": "", "tool_calls": [tool_call]}


def scripted(turns: list[dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A fake-server responder that sends turns[i] as the model's i-th message."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return turns[min(turn, len(turns) - 1)]

    return respond
