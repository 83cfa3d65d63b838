"""MCP tool servers in native environments: `MCPToolEnv(..., mcp_servers=[...])`.

Each rollout starts its own copy of every declared stdio server inside the sandbox (the chosen
backend, bubblewrap by default: no network, read-only system, only the interpreter's standard
library and the directories named in `pythonpath`), speaks MCP's JSON-RPC over its stdin and
stdout (initialize, tools/list, tools/call), and kills it when the rollout ends, so no state
crosses rollouts. The servers' tools join the environment's own: their input schemas go into
the chat template as OpenAI tool schemas, calls are dispatched to the server, and results come
back as tool messages. A tool error (the server says `isError`, or refuses the call) is text
the model reads; a server that does not start, dies or does not answer within `timeout_s`
errors the rollout, and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlkit.envs.rollout import Rollout
from rlkit.envs.tools import ToolCall, ToolEnv
from rlkit.inference import InferenceClient
from rlkit.sandbox.launch import Mounts
from rlkit.sandbox.process import kill_tree, spawn
from rlkit.sandbox.runner import active_backend, limits, require

PROTOCOL_VERSION = "2025-06-18"
LINE_LIMIT = 16 << 20  # one JSON-RPC message at most


class MCPServer(BaseModel):
    """One stdio MCP server an environment uses."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A label for errors and logs.")
    command: list[str] = Field(
        min_length=1,
        description="argv run inside the sandbox, e.g. ['python3', '-m', 'mcp_server_time'].",
    )
    pythonpath: list[Path] = Field(
        default_factory=list,
        description="Host directories bound read-only and put on PYTHONPATH (the server's "
        "installed packages, e.g. `uv pip install --target DIR mcp-server-time`).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Longest wait for any one answer.")
    startup_timeout_s: float = Field(60.0, gt=0, description="Longest wait for initialize.")
    memory_mb: int = Field(256, gt=0, description="Per-process memory cap in the sandbox.")
    lifetime_cpu_s: float = Field(600.0, gt=0, description="CPU seconds over its lifetime.")


class MCPServerError(RuntimeError):
    """The server failed (did not start, died, did not answer): the rollout errors."""


class MCPCallError(Exception):
    """The server answered a request with a JSON-RPC error: the model reads it."""


class StdioServer:
    """A running stdio server in the sandbox and its pending requests."""

    def __init__(self, spec: MCPServer) -> None:
        self.spec = spec
        self._stack = contextlib.ExitStack()
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._tasks: list[asyncio.Task] = []
        self._stderr = b""
        self._gone: str | None = None  # why the server can no longer answer
        self.tool_specs: dict[str, dict[str, Any]] = {}  # name -> the server's tool record

    async def start(self) -> None:
        mounts = Mounts(pythonpath=tuple(self.spec.pythonpath))
        script = "exec " + shlex.join(self.spec.command) + "\n"
        run_limits = limits(self.spec.lifetime_cpu_s, self.spec.memory_mb)
        launch = self._stack.enter_context(
            active_backend().prepare(script, "bash", {}, run_limits, mounts)
        )
        try:
            self._proc = await spawn(launch, line_limit=LINE_LIMIT)
        except OSError as exc:
            raise MCPServerError(f"MCP server {self.spec.name!r} did not start: {exc}") from None
        self._tasks = [
            asyncio.ensure_future(self._read_replies()),
            asyncio.ensure_future(self._read_stderr()),
        ]
        await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "rlkit", "version": "1"},
            },
            self.spec.startup_timeout_s,
        )
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise MCPServerError(self._failure(f"is gone ({exc})")) from None

    def _failure(self, what: str) -> str:
        tail = self._stderr.decode(errors="replace").strip()[-500:]
        return f"MCP server {self.spec.name!r} {what}" + (f"; stderr: {tail}" if tail else "")

    async def _read_replies(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            while line := await self._proc.stdout.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # not protocol (a stray print): MCP servers log to stderr
                if not isinstance(message, dict):
                    continue
                if "method" in message:  # a request or notification from the server
                    if "id" in message:
                        error = {"code": -32601, "message": "not supported by this client"}
                        reply = {"jsonrpc": "2.0", "id": message["id"], "error": error}
                        await self._send(reply)
                    continue
                future = self._pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ValueError, MCPServerError):  # a line over LINE_LIMIT, or stdin closed
            pass
        await asyncio.sleep(0.2)  # let stderr's last words arrive
        self._gone = self._failure("exited")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(MCPServerError(self._gone))
        self._pending.clear()

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while chunk := await self._proc.stderr.read(4096):
            self._stderr = (self._stderr + chunk)[-4096:]

    async def request(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        """The result of one request; MCPCallError when the server answered with an error."""
        if self._gone is not None:
            raise MCPServerError(self._gone)
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await self._send(message)
        try:
            async with asyncio.timeout(timeout):
                reply = await future
        except TimeoutError:
            self._pending.pop(request_id, None)
            raise MCPServerError(self._failure(f"did not answer {method} in {timeout} s")) from None
        if "error" in reply:
            error = reply["error"] or {}
            raise MCPCallError(str(error.get("message", error)))
        return reply.get("result") or {}

    async def tools(self) -> list[dict[str, Any]]:
        """The server's tools (every page)."""
        found: list[dict[str, Any]] = []
        cursor = None
        while True:
            params = {"cursor": cursor} if cursor else {}
            page = await self.request("tools/list", params, self.spec.timeout_s)
            found += page.get("tools") or []
            cursor = page.get("nextCursor")
            if not cursor:
                return found

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """What the model reads back from one tool call."""
        params = {"name": name, "arguments": arguments}
        try:
            result = await self.request("tools/call", params, self.spec.timeout_s)
        except MCPCallError as exc:
            return f"Error: {name}: {exc}"
        parts = []
        for item in result.get("content") or []:
            if item.get("type") == "text":
                parts.append(item.get("text", ""))
            else:
                parts.append(f"[{item.get('type')} content]")
        text = "\n".join(parts)
        if not text and result.get("structuredContent") is not None:
            text = json.dumps(result["structuredContent"])
        return f"Error: {text}" if result.get("isError") else text

    async def close(self) -> None:
        if self._proc is not None:
            kill_tree(self._proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stack.close()


def openai_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool as an OpenAI function schema (its input schema is the parameters)."""
    parameters = tool.get("inputSchema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": parameters,
        },
    }


# The running rollout's servers by tool name: each rollout runs in its own asyncio task.
_ROUTES: contextvars.ContextVar[dict[str, StdioServer]] = contextvars.ContextVar("mcp_routes")


class MCPToolEnv(ToolEnv):
    """A ToolEnv whose tools also come from MCP servers, started fresh for every rollout."""

    def __init__(
        self,
        *args: Any,
        mcp_servers: list[MCPServer | dict[str, Any]],
        tools: list[Callable[..., Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        require()  # the servers run in the sandbox: refuse now, with the fix
        super().__init__(list(tools or []), *args, **kwargs)
        self.mcp_servers = [MCPServer.model_validate(s) for s in mcp_servers]

    def tools_for_request(self) -> list[dict[str, Any]] | None:
        routes = _ROUTES.get({})
        schemas = list(self.tool_schemas)
        for name, server in routes.items():
            schemas.append(openai_schema(server.tool_specs[name]))
        return schemas or None

    async def call_tool(self, call: ToolCall) -> str:
        server = _ROUTES.get({}).get(call.name)
        if server is None or call.error:
            return await super().call_tool(call)
        return await server.call(call.name, call.arguments)  # MCPServerError: rollout errors

    async def _open(self) -> tuple[list[StdioServer], dict[str, StdioServer]]:
        servers: list[StdioServer] = []
        routes: dict[str, StdioServer] = {}
        try:
            for spec in self.mcp_servers:
                server = StdioServer(spec)
                servers.append(server)
                await server.start()
                server.tool_specs = {t["name"]: t for t in await server.tools()}
                for name in server.tool_specs:
                    if name in routes or name in self.tools:
                        raise MCPServerError(f"MCP tool {name!r} is offered twice")
                    routes[name] = server
        except BaseException:
            await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)
            raise
        return servers, routes

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        try:
            servers, routes = await self._open()
        except Exception as exc:  # not started, refused, or no sandbox: this rollout only
            rollout = self.new_rollout(row)
            rollout.error = f"environment error: {type(exc).__name__}: {exc}"
            return rollout
        token = _ROUTES.set(routes)
        try:
            return await super().rollout(row, client, model, sampling)
        finally:
            _ROUTES.reset(token)
            await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)
