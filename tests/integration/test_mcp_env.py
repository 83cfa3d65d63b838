"""MCP tool servers in a native environment: the real `mcp-server-time` from the package index
running in the bubblewrap sandbox, and servers that hang or die mid-rollout."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets import Dataset

from rlkit.envs.check import ScriptedClient
from rlkit.envs.mcp import MCPToolEnv
from rlkit.envs.rubric import Rubric
from rlkit.sandbox import backends
from tests.helpers.mcp_servers import broken_server_dir, install_mcp_server_time
from tests.helpers.system import require_system

pytestmark = [pytest.mark.system, pytest.mark.venv, pytest.mark.slow]


@pytest.fixture(scope="module")
def time_server() -> Iterator[Path]:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    folder = install_mcp_server_time()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _env(servers: list[dict]) -> MCPToolEnv:
    rows = Dataset.from_list([{"question": "What time is it in Paris?", "answer": "Paris"}])
    return MCPToolEnv(eval_dataset=rows, rubric=Rubric([]), mcp_servers=servers, max_turns=3)


def _call(name: str, arguments: dict) -> dict:
    body = json.dumps({"name": name, "arguments": arguments})
    return {"role": "assistant", "content": f"<tool_call>{body}</tool_call>"}


async def test_a_real_mcp_server_answers_tool_calls_from_the_sandbox(time_server: Path) -> None:
    env = _env(
        [
            {
                "name": "time",
                "command": ["python3", "-m", "mcp_server_time", "--local-timezone", "UTC"],
                "pythonpath": [str(time_server)],
            }
        ]
    )
    client = ScriptedClient(
        [
            _call("get_current_time", {"timezone": "Europe/Paris"}),
            _call(
                "convert_time",
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            ),
            {"role": "assistant", "content": "It is morning in Paris."},
        ]
    )
    row = env.eval_dataset[0]
    rollout = await env.rollout(row, client, "m", {})
    assert rollout.error is None, rollout.error
    tools = [m for m in rollout.completion if m["role"] == "tool"]
    assert [t["name"] for t in tools] == ["get_current_time", "convert_time"]
    now = json.loads(tools[0]["content"])
    assert now["timezone"] == "Europe/Paris" and now["datetime"]
    converted = json.loads(tools[1]["content"])
    assert converted["target"]["datetime"].endswith("21:00:00+09:00")
    bad = await env.rollout(
        row,
        ScriptedClient(
            [
                _call("get_current_time", {"timezone": "Mars/Base"}),
                {"role": "assistant", "content": "ok"},
            ]
        ),
        "m",
        {},
    )
    assert bad.error is None
    assert "Error" in [m for m in bad.completion if m["role"] == "tool"][0]["content"]


@pytest.mark.parametrize("mode", ["hang", "die"])
async def test_a_server_that_hangs_or_dies_errors_the_rollout(mode: str) -> None:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    folder = broken_server_dir()
    env = _env(
        [
            {
                "name": "broken",
                "command": ["python3", "-m", "broken_mcp", mode],
                "pythonpath": [str(folder)],
                "timeout_s": 3,
            }
        ]
    )
    script = [_call("echo", {"text": "hi"}), {"role": "assistant", "content": "done"}]
    row = env.eval_dataset[0]
    rollout = await asyncio.wait_for(env.rollout(row, ScriptedClient(script), "m", {}), 60)
    expected = "did not answer tools/call" if mode == "hang" else "exited"
    assert rollout.error is not None and expected in rollout.error
    if mode == "die":
        assert "dying on purpose" in rollout.error
    shutil.rmtree(folder, ignore_errors=True)


async def test_a_server_that_does_not_start_errors_only_its_rollout() -> None:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    env = _env([{"name": "missing", "command": ["python3", "-m", "no_such_module_xyz"]}])
    script = [{"role": "assistant", "content": "done"}]
    rollout = await asyncio.wait_for(
        env.rollout(env.eval_dataset[0], ScriptedClient(script), "m", {}), 90
    )
    assert rollout.error is not None and "no_such_module_xyz" in rollout.error
