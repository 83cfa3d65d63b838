"""ToolEnv: OpenAI-style tool calling with Python functions as tools.

Schemas come from each function's signature and Google-style docstring
(rlkit.envs.tool_schema: transformers' `get_json_schema` rules, without importing transformers).
Tool calls are read from the server's parsed `tool_calls` and, for engines without a tool
parser (tiny models), from `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` text.
Tools run sync (in a thread) or async, with their arguments validated and coerced against the
type hints (pydantic); their results, or their errors as text, go back to the model as `tool`
messages.
The conversation ends when the model answers without calling a tool.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError, validate_call

from rlkit.envs.environment import Messages
from rlkit.envs.multiturn import MultiTurnEnv
from rlkit.envs.tool_schema import get_json_schema

TOOL_CALL_TEXT = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool schema of a function (every argument must be documented)."""
    schema = get_json_schema(func)
    schema["function"].pop("return", None)
    return schema


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None = None  # set when the call could not be parsed


def _parse_arguments(raw: Any) -> dict[str, Any]:
    args = json.loads(raw) if isinstance(raw, str) else raw
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
    return args


def parse_tool_calls(message: dict[str, Any]) -> list[ToolCall]:
    """Tool calls of an assistant message: server-parsed ones, else `<tool_call>` text."""
    calls: list[ToolCall] = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        call_id = call.get("id") or f"call_{i}"
        try:
            calls.append(
                ToolCall(call_id, fn.get("name", ""), _parse_arguments(fn.get("arguments")))
            )
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            calls.append(ToolCall(call_id, fn.get("name", ""), {}, f"malformed arguments: {exc}"))
    if calls:
        return calls
    for i, body in enumerate(TOOL_CALL_TEXT.findall(message.get("content") or "")):
        try:
            data = json.loads(body)
            if not isinstance(data, dict) or "name" not in data:
                raise ValueError('expected {"name": ..., "arguments": {...}}')
            calls.append(
                ToolCall(f"call_{i}", str(data["name"]), _parse_arguments(data.get("arguments")))
            )
        except ValueError as exc:
            calls.append(ToolCall(f"call_{i}", "", {}, f"malformed tool call: {exc}"))
    return calls


class ToolEnv(MultiTurnEnv):
    """A multi-turn environment whose environment turns are tool results."""

    def __init__(self, tools: list[Callable[..., Any]], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools = {func.__name__: validate_call(func) for func in tools}
        self.tool_schemas = [tool_schema(func) for func in tools]

    def tools_for_request(self, state: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        return self.tool_schemas or None

    async def is_completed(self, messages: Messages, state: dict[str, Any]) -> bool:
        return not parse_tool_calls(messages[-1])

    async def call_tool_in(self, call: ToolCall, state: dict[str, Any]) -> str:
        """Run one call of the rollout whose `state` is given (MCPToolEnv routes by it to that
        rollout's servers); by default `call_tool`."""
        return await self.call_tool(call)

    async def call_tool(self, call: ToolCall) -> str:
        """Run one call; any failure becomes an error text the model can read."""
        if call.error:
            return f"Error: {call.error}"
        func = self.tools.get(call.name)
        if func is None:
            return f"Error: unknown tool {call.name!r}; available: {', '.join(self.tools)}"
        try:
            if inspect.iscoroutinefunction(func):
                result = await func(**call.arguments)
            else:
                result = await asyncio.to_thread(func, **call.arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            return f"Error: invalid arguments for {call.name}: {problems}"
        except Exception as exc:
            return f"Error: {call.name} raised {type(exc).__name__}: {exc}"
        return result if isinstance(result, str) else json.dumps(result, default=str)

    async def env_response(self, messages: Messages, state: dict[str, Any]) -> Messages:
        calls = parse_tool_calls(messages[-1])
        results = await asyncio.gather(*(self.call_tool_in(call, state) for call in calls))
        return [
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result}
            for call, result in zip(calls, results, strict=True)
        ]
