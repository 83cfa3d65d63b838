"""MCP tool servers in native environments: `MCPToolEnv(..., mcp_servers=[...])`.

A server is a stdio command (`command`) or a URL (`url`, MCP's streamable HTTP transport).
Each rollout starts its own copy of every declared stdio server inside the sandbox (the chosen
backend, bubblewrap by default: no network, read-only system, only the interpreter's standard
library and the directories named in `pythonpath`), speaks MCP's JSON-RPC over its stdin and
stdout (initialize, tools/list, tools/call), and kills it when the rollout ends, so no state
crosses rollouts. The servers' tools join the environment's own: their input schemas go into
the chat template as OpenAI tool schemas, calls are dispatched to the server, and results come
back as tool messages. A tool error (the server says `isError`, or refuses the call) is text
the model reads; a server that does not start, dies or does not answer within `timeout_s`
errors the rollout, and the run goes on.

A URL server runs elsewhere, outside rlkit's sandbox (the operator trusts it): each rollout
opens its own MCP session on it (initialize, with the `Mcp-Session-Id` the server hands out)
and ends it (DELETE) when the rollout ends, so no state crosses rollouts unless the server
keeps it. Its replies are JSON or an SSE stream; a connection error, an HTTP error status or a
timeout errors the rollout as for a stdio server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlkit.envs.rollout import Rollout
from rlkit.envs.tools import ToolCall, ToolEnv
from rlkit.inference import InferenceClient
from rlkit.sandbox.backends import Backend
from rlkit.sandbox.launch import Mounts
from rlkit.sandbox.process import kill_tree, spawn
from rlkit.sandbox.runner import limits, require_here

PROTOCOL_VERSION = "2025-06-18"
LINE_LIMIT = 16 << 20  # one JSON-RPC message at most


class MCPServer(BaseModel):
    """One MCP server an environment uses: a stdio `command` or a `url`, exactly one."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A label for errors and logs.")
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="argv run inside the sandbox, e.g. ['python3', '-m', 'mcp_server_time'].",
    )
    url: str | None = Field(
        None,
        description="http(s) URL of a running server (MCP's streamable HTTP transport), e.g. "
        "'http://127.0.0.1:8000/mcp'. It runs outside rlkit's sandbox: only name one you trust.",
    )
    headers_env: dict[str, str] = Field(
        default_factory=dict,
        description="URL servers: HTTP header name -> the environment variable holding its "
        "value, e.g. {'Authorization': 'MY_MCP_AUTH'} with MY_MCP_AUTH='Bearer ...', so no "
        "secret sits in a config file.",
    )
    pythonpath: list[Path] = Field(
        default_factory=list,
        description="Stdio servers: host directories bound read-only and put on PYTHONPATH (the "
        "server's installed packages, e.g. `uv pip install --target DIR mcp-server-time`).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Longest wait for any one answer.")
    startup_timeout_s: float = Field(60.0, gt=0, description="Longest wait for initialize.")
    memory_mb: int = Field(256, gt=0, description="Stdio servers: memory cap in the sandbox.")
    lifetime_cpu_s: float = Field(
        600.0, gt=0, description="Stdio servers: CPU seconds over their lifetime."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"url must be an http:// or https:// URL with a host, not {url!r}")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"MCP server {self.name!r}: give exactly one of `command` (a stdio server) "
                "or `url` (a server reached over HTTP)"
            )
        wrong = (
            {"pythonpath", "memory_mb", "lifetime_cpu_s"} if self.url else {"headers_env"}
        ) & self.model_fields_set
        if wrong:
            kind = "a URL" if self.url else "a stdio"
            raise ValueError(
                f"MCP server {self.name!r}: {sorted(wrong)} do not apply to {kind} server"
            )
        return self

    def headers(self) -> dict[str, str]:
        """The headers from `headers_env`, read now; ValueError names a variable not set."""
        missing = [var for var in self.headers_env.values() if var not in os.environ]
        if missing:
            raise ValueError(
                f"MCP server {self.name!r}: the environment variable(s) {missing} named in "
                "headers_env are not set"
            )
        return {header: os.environ[var] for header, var in self.headers_env.items()}


class MCPServerError(RuntimeError):
    """The server failed (did not start, died, did not answer): the rollout errors."""


class MCPCallError(Exception):
    """The server answered a request with a JSON-RPC error: the model reads it."""


class MCPSession(ABC):
    """What every transport shares: initialize, tools/list (every page) and tools/call over
    one `request()` the transport implements."""

    def __init__(self, spec: MCPServer) -> None:
        self.spec = spec
        self.tool_specs: dict[str, dict[str, Any]] = {}  # name -> the server's tool record

    @abstractmethod
    async def start(self) -> None:
        """Reach the server and initialize a session."""

    @abstractmethod
    async def request(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        """The result of one request; MCPCallError when the server answered with an error."""

    @abstractmethod
    async def notify(self, method: str) -> None:
        """Send a notification (no reply)."""

    @abstractmethod
    async def close(self) -> None:
        """End the session (never raises)."""

    async def initialize(self) -> None:
        """MCP's handshake: initialize, then notifications/initialized."""
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "rlkit", "version": "1"},
        }
        await self.request("initialize", params, self.spec.startup_timeout_s)
        await self.notify("notifications/initialized")

    @staticmethod
    def result_of(reply: dict[str, Any]) -> Any:
        """A reply's result; its JSON-RPC error as MCPCallError."""
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


# A server's request to the client (sampling, roots, elicitation): this client offers none.
NOT_SUPPORTED = {"code": -32601, "message": "not supported by this client"}


class StdioServer(MCPSession):
    """A running stdio server in the sandbox (on `backend`: this host's, checked when the
    environment loaded) and its pending requests."""

    def __init__(self, spec: MCPServer, backend: Backend) -> None:
        super().__init__(spec)
        self.backend = backend
        self._stack = contextlib.ExitStack()
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._tasks: list[asyncio.Task] = []
        self._stderr = b""
        self._gone: str | None = None  # why the server can no longer answer

    async def start(self) -> None:
        assert self.spec.command is not None
        mounts = Mounts(pythonpath=tuple(self.spec.pythonpath))
        script = "exec " + shlex.join(self.spec.command) + "\n"
        run_limits = limits(self.spec.lifetime_cpu_s, self.spec.memory_mb)
        launch = self._stack.enter_context(
            self.backend.prepare(script, "bash", {}, run_limits, mounts)
        )
        try:
            self._proc = await spawn(launch, line_limit=LINE_LIMIT)
        except OSError as exc:
            raise MCPServerError(f"MCP server {self.spec.name!r} did not start: {exc}") from None
        self._tasks = [
            asyncio.ensure_future(self._read_replies()),
            asyncio.ensure_future(self._read_stderr()),
        ]
        await self.initialize()

    async def notify(self, method: str) -> None:
        await self._send({"jsonrpc": "2.0", "method": method})

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
                        reply = {"jsonrpc": "2.0", "id": message["id"], "error": NOT_SUPPORTED}
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
        return self.result_of(reply)

    async def close(self) -> None:
        if self._proc is not None:
            kill_tree(self._proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stack.close()


class HttpServer(MCPSession):
    """One MCP session on a server reached by URL (streamable HTTP): every message is a POST,
    answered with JSON or an SSE stream that carries the reply."""

    def __init__(self, spec: MCPServer) -> None:
        super().__init__(spec)
        assert spec.url is not None
        self.url = spec.url
        self._client: httpx.AsyncClient | None = None
        self._session: dict[str, str] = {}  # Mcp-Session-Id and MCP-Protocol-Version, once known
        self._next_id = 0

    def _failure(self, what: str) -> str:
        return f"MCP server {self.spec.name!r} at {self.url} {what}"

    async def start(self) -> None:
        try:
            headers = self.spec.headers()
        except ValueError as exc:
            raise MCPServerError(str(exc)) from None
        # asyncio.timeout bounds every exchange (connect included), so httpx's own is off
        self._client = httpx.AsyncClient(headers=headers, timeout=None, follow_redirects=False)
        await self.initialize()

    async def notify(self, method: str) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        await self._exchange(message, method, self.spec.timeout_s)

    async def request(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        reply = await self._exchange(message, method, timeout)
        if reply is None:
            raise MCPServerError(self._failure(f"sent no reply to {method}"))
        result = self.result_of(reply)
        if method == "initialize":  # every later message names the version agreed on
            version = result.get("protocolVersion") if isinstance(result, dict) else None
            self._session["MCP-Protocol-Version"] = str(version or PROTOCOL_VERSION)
        return result

    async def _exchange(
        self, message: dict[str, Any], method: str, timeout: float
    ) -> dict[str, Any] | None:
        """POST one message; the reply with its id (None for a notification)."""
        assert self._client is not None
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **self._session,
        }
        try:
            async with asyncio.timeout(timeout):
                async with self._client.stream(
                    "POST", self.url, content=json.dumps(message), headers=headers
                ) as response:
                    if not response.is_success:
                        body = b""
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) >= 500:
                                break
                        status = f"HTTP {response.status_code}"
                        text = body[:500].decode(errors="replace")
                        raise MCPServerError(
                            self._failure(f"answered {method} with {status}: {text}")
                        )
                    if method == "initialize" and "mcp-session-id" in response.headers:
                        self._session["Mcp-Session-Id"] = response.headers["mcp-session-id"]
                    if "id" not in message or "method" not in message:
                        return None  # a notification or an answer: accepted, nothing comes back
                    async for reply in self._messages(response):
                        if "method" in reply:  # the server's own request or notification
                            if "id" in reply:
                                answer = {
                                    "jsonrpc": "2.0",
                                    "id": reply["id"],
                                    "error": NOT_SUPPORTED,
                                }
                                await self._exchange(answer, "a reply", timeout)
                            continue
                        if reply.get("id") == message["id"]:
                            return reply
                    return None
        except TimeoutError:
            raise MCPServerError(self._failure(f"did not answer {method} in {timeout} s")) from None
        except httpx.HTTPError as exc:
            raise MCPServerError(
                self._failure(f"failed on {method}: {type(exc).__name__}: {exc}")
            ) from None

    async def _messages(self, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        """The JSON-RPC messages of one reply (a JSON body, or an SSE stream's `data:` events),
        at most LINE_LIMIT bytes in all."""
        sse = response.headers.get("content-type", "").startswith("text/event-stream")
        data: list[bytes] = []
        async for line in self._lines(response):
            if not sse:
                data.append(line)
            elif line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif not line and data:  # an SSE event ends
                if (message := self._parse(b"\n".join(data))) is not None:
                    yield message
                data = []
        if data and (message := self._parse(b"\n".join(data))) is not None:
            yield message

    async def _lines(self, response: httpx.Response) -> AsyncIterator[bytes]:
        size = 0
        pending = bytearray()
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > LINE_LIMIT:
                raise MCPServerError(self._failure(f"sent a reply over {LINE_LIMIT} bytes"))
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                pending += chunk[start:end]
                yield bytes(pending).rstrip(b"\r")
                pending.clear()
                start = end + 1
            pending += chunk[start:]
        if pending:
            yield bytes(pending).rstrip(b"\r")

    @staticmethod
    def _parse(data: bytes) -> dict[str, Any] | None:
        try:
            message = json.loads(data)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    async def close(self) -> None:
        if self._client is None:
            return
        if "Mcp-Session-Id" in self._session:  # end the session; the server may refuse (405)
            with contextlib.suppress(httpx.HTTPError, TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._client.delete(self.url, headers=self._session)
        await self._client.aclose()


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


ROUTES = "mcp_routes"  # the rollout's state: its MCP servers by tool name


class MCPToolEnv(ToolEnv):
    """A ToolEnv whose tools also come from MCP servers: stdio servers started fresh for every
    rollout, URL servers with a fresh MCP session per rollout."""

    def __init__(
        self,
        *args: Any,
        mcp_servers: list[MCPServer | dict[str, Any]],
        tools: list[Callable[..., Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.mcp_servers = [MCPServer.model_validate(s) for s in mcp_servers]
        # stdio servers run in this host's sandbox, a service or not: refuse now, with the fix
        self.backend = require_here() if any(s.command for s in self.mcp_servers) else None
        for spec in self.mcp_servers:
            spec.headers()  # a header's variable that is not set: refuse now, naming it
        super().__init__(list(tools or []), *args, **kwargs)

    def tools_for_request(self, state: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """The environment's own tools, and the MCP tools of the rollout whose `state` is given."""
        routes: dict[str, MCPSession] = (state or {}).get(ROUTES, {})
        schemas = list(self.tool_schemas)
        for name, server in routes.items():
            schemas.append(openai_schema(server.tool_specs[name]))
        return schemas or None

    async def call_tool_in(self, call: ToolCall, state: dict[str, Any]) -> str:
        """An MCP tool on this rollout's server for it; else the environment's own."""
        server = state.get(ROUTES, {}).get(call.name)
        if server is None or call.error:
            return await super().call_tool_in(call, state)
        return await server.call(call.name, call.arguments)  # MCPServerError: rollout errors

    async def _open(self) -> tuple[list[MCPSession], dict[str, MCPSession]]:
        servers: list[MCPSession] = []
        routes: dict[str, MCPSession] = {}
        try:
            for spec in self.mcp_servers:
                server: MCPSession = (
                    HttpServer(spec) if spec.url else StdioServer(spec, self._backend())
                )
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

    def _backend(self) -> Backend:
        assert self.backend is not None  # resolved at load whenever a stdio server is listed
        return self.backend

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        rollout = self.new_rollout(row)
        try:
            servers, routes = await self._open()
        except Exception as exc:  # not started, refused, or no sandbox: this rollout only
            rollout.error = f"environment error: {type(exc).__name__}: {exc}"
            return rollout
        rollout.state = {**self.init_state(row), ROUTES: routes}
        try:
            return await self.run_turns(rollout, client, model, sampling)
        finally:
            rollout.state.pop(ROUTES, None)  # the servers close now; the rubric sees the rest
            await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)
