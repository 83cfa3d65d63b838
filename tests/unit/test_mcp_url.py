"""MCP servers by URL, in process: the config's checks, and the HTTP client against a server
that misbehaves (errors, floods, silence, requests of its own) on a loopback port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from datasets import Dataset
from pydantic import ValidationError

from rlkit.envs import mcp
from rlkit.envs.check import ScriptedClient
from rlkit.envs.mcp import ROUTES, HttpServer, MCPServer, MCPServerError, MCPToolEnv
from rlkit.envs.rubric import Rubric
from rlkit.envs.tools import ToolCall
from rlkit.ports import free_port


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "exactly one of `command`"),
        ({"command": ["python3"], "url": "http://127.0.0.1:1/mcp"}, "exactly one of `command`"),
        ({"url": "file:///etc/passwd"}, "http:// or https://"),
        ({"url": "http:///mcp"}, "http:// or https://"),
        ({"url": "http://h/mcp", "pythonpath": ["/tmp"]}, "['pythonpath'] do not apply to a URL"),
        ({"url": "http://h/mcp", "memory_mb": 5}, "['memory_mb'] do not apply to a URL"),
        ({"command": ["x"], "headers_env": {"A": "B"}}, "['headers_env'] do not apply to a stdio"),
        ({"command": []}, "command"),
        ({"url": "http://h/mcp", "header": {"A": "B"}}, "header"),
    ],
)
def test_a_server_is_a_command_or_a_url_and_a_wrong_field_is_named(
    fields: dict, expected: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        MCPServer.model_validate({"name": "s", **fields})
    assert expected in str(caught.value)


def test_a_url_server_needs_no_sandbox_and_a_missing_header_variable_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = Dataset.from_list([{"question": "q", "answer": "a"}])
    server = {"name": "s", "url": "https://example.invalid/mcp", "headers_env": {"X-Key": "K48"}}
    monkeypatch.delenv("K48", raising=False)
    with pytest.raises(ValueError, match="K48"):
        MCPToolEnv(eval_dataset=rows, rubric=Rubric([]), mcp_servers=[server])
    monkeypatch.setenv("K48", "v")
    env = MCPToolEnv(eval_dataset=rows, rubric=Rubric([]), mcp_servers=[server])
    assert env.mcp_servers[0].headers() == {"X-Key": "v"}


TOOL = {"name": "add", "inputSchema": {"type": "object", "properties": {}}}


class Scripted:
    """An MCP endpoint whose tools/call answer is `on_call`; it records every request."""

    def __init__(self, on_call: Callable[[web.Request, dict], AsyncIterator[bytes] | dict]):
        self.on_call = on_call
        self.seen: list[tuple[str, dict, dict | None]] = []  # (HTTP method, headers, body)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.method == "POST" else None
        self.seen.append((request.method, dict(request.headers), body))
        if request.method == "DELETE" or "id" not in body or "method" not in body:
            return web.Response(status=202)
        if body["method"] == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {}}
            return web.json_response(
                {"jsonrpc": "2.0", "id": body["id"], "result": result},
                headers={"Mcp-Session-Id": "sess-1"},
            )
        if body["method"] == "tools/list":
            return web.json_response(
                {"jsonrpc": "2.0", "id": body["id"], "result": {"tools": [TOOL]}}
            )
        answer = self.on_call(request, body)
        if isinstance(answer, dict):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async for chunk in answer:
            await response.write(chunk)
        return response


async def serving(scripted: Scripted) -> tuple[web.AppRunner, str]:
    app = web.Application(client_max_size=1 << 20)
    app.router.add_route("*", "/mcp", scripted.handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/mcp"


def event(message: dict) -> bytes:
    return b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n"


async def call_through(on_call, **spec) -> tuple[str | BaseException, Scripted]:
    """What `add` returns (or raises) against a server answering calls with `on_call`."""
    scripted = Scripted(on_call)
    runner, url = await serving(scripted)
    server = HttpServer(MCPServer(name="s", url=url, timeout_s=2, **spec))
    try:
        await server.start()
        assert [t["name"] for t in await server.tools()] == ["add"]
        try:
            outcome: str | BaseException = await server.call("add", {"a": 1})
        except MCPServerError as exc:
            outcome = exc
        await server.close()
    finally:
        await runner.cleanup()
    return outcome, scripted


async def test_an_sse_reply_after_the_servers_own_request_and_the_session_headers() -> None:
    async def stream(request, body):
        yield b": keep-alive\n\n"
        yield event({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})
        yield event({"jsonrpc": "2.0", "id": "srv-1", "method": "roots/list"})
        yield event({"jsonrpc": "2.0", "id": 999, "result": {}})  # not ours
        content = [{"type": "text", "text": "3"}]
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": {"content": content}}
        data = json.dumps(reply).encode()
        yield b"data: " + data[:10] + b"\r\ndata:" + data[10:] + b"\r\n\r\n"  # split, CRLF
        content[0]["text"] = "a second answer, never read"
        yield event(reply)

    outcome, scripted = await call_through(lambda request, body: stream(request, body))
    assert outcome == "3"
    methods = [(m, (b or {}).get("method") or (b and "reply")) for m, _, b in scripted.seen]
    assert methods == [
        ("POST", "initialize"),
        ("POST", "notifications/initialized"),
        ("POST", "tools/list"),
        ("POST", "tools/call"),
        ("POST", "reply"),
        ("DELETE", None),
    ]
    answer = scripted.seen[4][2]
    assert answer["id"] == "srv-1" and answer["error"]["code"] == -32601
    first_headers = scripted.seen[0][1]
    assert first_headers["Accept"] == "application/json, text/event-stream"
    assert first_headers["Content-Type"] == "application/json"
    assert "Mcp-Session-Id" not in first_headers
    for _, headers, _ in scripted.seen[1:]:
        assert headers["Mcp-Session-Id"] == "sess-1"
        assert headers["MCP-Protocol-Version"] == "2025-06-18"


async def test_headers_come_from_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_TEST_AUTH", "Bearer s3cret")
    ok = {"jsonrpc": "2.0", "id": 0, "result": {"content": [{"type": "text", "text": "ok"}]}}
    outcome, scripted = await call_through(
        lambda request, body: {**ok, "id": body["id"]},
        headers_env={"Authorization": "MCP_TEST_AUTH"},
    )
    assert outcome == "ok"
    assert all(h["Authorization"] == "Bearer s3cret" for _, h, _ in scripted.seen)


async def test_a_json_rpc_error_is_text_for_the_model() -> None:
    def refuse(request, body):
        return {"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32602, "message": "no b"}}

    outcome, _ = await call_through(refuse)
    assert outcome == "Error: add: no b"


async def test_an_http_error_errors_the_rollout() -> None:
    def fail(request, body):
        raise web.HTTPInternalServerError(text="database on fire")

    outcome, _ = await call_through(fail)
    assert isinstance(outcome, MCPServerError)
    assert "HTTP 500" in str(outcome) and "database on fire" in str(outcome)


async def test_an_accepted_request_without_a_reply_errors_the_rollout() -> None:
    def accept(request, body):
        raise web.HTTPAccepted()

    outcome, _ = await call_through(accept)
    assert isinstance(outcome, MCPServerError) and "sent no reply to tools/call" in str(outcome)


async def test_a_flood_is_cut_at_the_reply_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp, "LINE_LIMIT", 1 << 16)

    async def flood(request, body):
        for _ in range(1000):
            yield b"data: " + b"x" * 4096  # one endless line

    outcome, _ = await call_through(flood)
    assert isinstance(outcome, MCPServerError) and "over 65536 bytes" in str(outcome)


async def test_a_stream_that_never_answers_times_out() -> None:
    async def silence(request, body):
        for _ in range(100):
            yield b": still thinking\n\n"
            await asyncio.sleep(0.2)

    started = asyncio.get_running_loop().time()
    outcome, _ = await call_through(silence)
    assert isinstance(outcome, MCPServerError) and "did not answer tools/call in 2" in str(outcome)
    assert asyncio.get_running_loop().time() - started < 10


async def test_nobody_listening_errors_the_rollout_not_the_run() -> None:
    rows = Dataset.from_list([{"question": "q", "answer": "a"}])
    url = f"http://127.0.0.1:{free_port()}/mcp"
    env = MCPToolEnv(
        eval_dataset=rows, rubric=Rubric([]), mcp_servers=[{"name": "gone", "url": url}]
    )
    client = ScriptedClient([{"role": "assistant", "content": "done"}])
    rollout = await asyncio.wait_for(env.rollout(env.eval_dataset[0], client, "m", {}), 30)
    assert (
        rollout.error is not None and "'gone'" in rollout.error and "ConnectError" in rollout.error
    )


class OneRollout:
    """A rollout's MCP session: its tool specs, answering calls with its own name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tool_specs = {"add": TOOL}

    async def call(self, tool: str, arguments: dict) -> str:
        await asyncio.sleep(0)
        return f"{self.name}: {tool}"


async def test_each_rollout_routes_its_tools_to_its_own_servers_through_its_state() -> None:
    """The MCP routes live on the rollout (its state), not in process or task state: two
    rollouts at once each call their own server; outside a rollout only local tools show."""
    rows = Dataset.from_list([{"question": "q", "answer": "a"}])
    server = {"name": "s", "url": "https://example.invalid/mcp"}
    env = MCPToolEnv(eval_dataset=rows, rubric=Rubric([]), mcp_servers=[server])
    states = [{ROUTES: {"add": OneRollout(name)}} for name in ("a", "b")]
    call = ToolCall("call_0", "add", {})
    both = await asyncio.gather(*(env.call_tool_in(call, s) for s in states))
    assert both == ["a: add", "b: add"]
    assert [t["function"]["name"] for t in env.tools_for_request(states[0]) or []] == ["add"]
    assert env.tools_for_request() is None
    assert (await env.call_tool_in(call, {})).startswith("Error: unknown tool 'add'")
