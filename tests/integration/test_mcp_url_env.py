"""MCP servers by URL in a native environment: a real server on the `mcp` SDK's streamable HTTP
transport (tests/helpers/mcp_http.py) in a subprocess, reached by `MCPToolEnv` through rollouts;
the server killed mid-rollout and brought back, a tool that hangs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from datasets import Dataset

from rlkit.envs.check import ScriptedClient
from rlkit.envs.mcp import MCPToolEnv
from rlkit.envs.rubric import Rubric
from rlkit.inference import Generation
from tests.helpers.mcp_http import MCPHttpServer, mcp_http_server

pytestmark = pytest.mark.slow  # each server start is a Python process importing the SDK


class Model(ScriptedClient):
    """A scripted model that records the tools each turn offered and runs `before[turn]` first."""

    def __init__(self, script: list[dict], before: dict[int, Callable[[], None]] | None = None):
        super().__init__(script)
        self.before = before or {}
        self.offered: list[list[str]] = []

    async def chat(
        self,
        messages: list[dict],
        model: str,
        sampling: dict | None = None,
        tools: list[dict] | None = None,
    ) -> Generation:
        self.offered.append([t["function"]["name"] for t in tools or []])
        if hook := self.before.get(self.calls):
            hook()
        return await super().chat(messages, model, sampling, tools)


def _env(url: str, **server: Any) -> MCPToolEnv:
    rows = Dataset.from_list([{"question": "What is 2 + 3?", "answer": "5"}])
    spec = {"name": "calc", "url": url, **server}
    return MCPToolEnv(eval_dataset=rows, rubric=Rubric([]), mcp_servers=[spec], max_turns=6)


def _call(name: str, arguments: dict) -> dict:
    body = json.dumps({"name": name, "arguments": arguments})
    return {"role": "assistant", "content": f"<tool_call>{body}</tool_call>"}


def _tool_texts(rollout) -> list[str]:
    return [m["content"] for m in rollout.completion if m["role"] == "tool"]


@pytest.fixture(scope="module", params=["sse", "json"])
def server(request) -> Iterator[MCPHttpServer]:
    with mcp_http_server(json_response=request.param == "json") as running:
        yield running


async def test_tools_by_url_are_offered_called_and_fresh_per_rollout(
    server: MCPHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALC_KEY", "k-123")
    env = _env(server.url, headers_env={"X-Api-Key": "CALC_KEY"})
    row = env.eval_dataset[0]
    for _ in range(2):  # the counter starts over: each rollout has its own MCP session
        model = Model(
            [
                _call("add", {"a": 2, "b": 3}),
                _call("whoami", {}),
                _call("count", {}),
                _call("count", {}),
                {"role": "assistant", "content": "5"},
            ]
        )
        rollout = await asyncio.wait_for(env.rollout(row, model, "m", {}), 60)
        assert rollout.error is None, rollout.error
        assert model.offered[0] == ["add", "nap", "whoami", "count"]
        assert _tool_texts(rollout) == ["5", "k-123", "1", "2"]
    bad = await env.rollout(row, Model([_call("add", {"a": "x"}), {"content": "?"}]), "m", {})
    assert bad.error is None
    assert _tool_texts(bad)[0].startswith("Error:") and "valid integer" in _tool_texts(bad)[0]


async def test_a_hanging_tool_errors_the_rollout_after_timeout_s(server: MCPHttpServer) -> None:
    env = _env(server.url, timeout_s=2)
    model = Model([_call("nap", {"seconds": 60}), {"role": "assistant", "content": "done"}])
    started = asyncio.get_running_loop().time()
    rollout = await asyncio.wait_for(env.rollout(env.eval_dataset[0], model, "m", {}), 60)
    assert rollout.error is not None and "did not answer tools/call in 2" in rollout.error
    assert asyncio.get_running_loop().time() - started < 20
    after = await env.rollout(
        env.eval_dataset[0], Model([_call("add", {"a": 1, "b": 1}), {"content": "2"}]), "m", {}
    )
    assert _tool_texts(after) == ["2"]  # the server still serves


async def test_a_server_killed_mid_rollout_errors_that_rollout_and_the_next_one_works() -> None:
    with mcp_http_server() as server:
        env = _env(server.url, timeout_s=10)
        row = env.eval_dataset[0]
        script = [_call("add", {"a": 1, "b": 2}), _call("add", {"a": 3, "b": 4})]
        model = Model([*script, {"content": "7"}], before={1: server.stop})
        rollout = await asyncio.wait_for(env.rollout(row, model, "m", {}), 60)
        assert _tool_texts(rollout) == ["3"]  # the first call was served, the second was not
        assert rollout.error is not None and "'calc'" in rollout.error
        assert "ConnectError" in rollout.error or "RemoteProtocolError" in rollout.error
        down = await env.rollout(row, Model([{"content": "?"}]), "m", {})
        assert down.error is not None and "ConnectError" in down.error
        server.start()
        back = await asyncio.wait_for(
            env.rollout(row, Model([*script, {"content": "7"}]), "m", {}), 60
        )
        assert back.error is None, back.error
        assert _tool_texts(back) == ["3", "7"]
