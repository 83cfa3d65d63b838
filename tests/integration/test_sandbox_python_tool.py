"""PythonToolEnv against the fake OpenAI server with a scripted model that calls `python`."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset

from rlkit.envs import Rubric, SingleTurnEnv, extract_boxed_answer
from rlkit.envs.python_tool import PythonToolEnv, with_python_tool
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.system


def scripted_model(cells: list[str]) -> Any:
    """A responder that runs `cells` one per turn, then boxes the last tool output."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        tool_outputs = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        step = len(tool_outputs)
        if step < len(cells):
            call = {"name": "python", "arguments": json.dumps({"code": cells[step]})}
            return {
                "content": f"Step {step}.",
                "tool_calls": [{"id": f"call_{step}", "type": "function", "function": call}],
            }
        return {"content": f"The answer is \\boxed{{{tool_outputs[-1].strip()}}}."}

    return respond


def _sessions_alive(marker: str) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    alive.append(int(entry.name))
            except OSError:
                continue
    return alive


def _arithmetic_env() -> SingleTurnEnv:
    def correct(completion: list[dict[str, Any]], answer: str) -> float:
        return float(extract_boxed_answer(completion[-1]["content"] or "") == answer)

    data = Dataset.from_list([{"question": "What is 6 * 7 + 1?", "answer": "43"}])
    return SingleTurnEnv(dataset=data, rubric=Rubric([correct]), env_id="arith")


async def test_state_persists_across_calls_and_session_is_closed() -> None:
    output_limit = random.randint(40_000, 50_000)  # appears in the interpreter's command line
    env = with_python_tool(_arithmetic_env(), output_limit=output_limit)
    assert isinstance(env, PythonToolEnv) and env.env_id == "arith"
    cells = ["x = 6 * 7", "import math\ny = x + 1", "print(y)"]
    with FakeOpenAIServer(responder=scripted_model(cells)) as server:
        async with InferenceClient(server.url) as client:
            rollouts = await env.run_group(env.dataset[0], client, "fake-model", {}, n=2)
    for rollout in rollouts:
        assert rollout.error is None, rollout.error
        tool_messages = [m["content"] for m in rollout.completion if m["role"] == "tool"]
        assert tool_messages == ["(no output)", "(no output)", "43\n"]
        assert rollout.reward == 1.0
        assert len(rollout.turns) == 4
        mask = rollout.training_sample().loss_mask
        assert 0 < sum(mask) < len(mask)  # tool output tokens are not trained on
    assert _sessions_alive(f"main.py {output_limit}") == []


async def test_rollouts_do_not_share_state_and_timeouts_restart() -> None:
    env = with_python_tool(_arithmetic_env(), cell_timeout=1.0)
    cells = ["'secret' in globals()", "secret = 1\nwhile True: pass", "secret"]
    with FakeOpenAIServer(responder=scripted_model(cells)) as server:
        async with InferenceClient(server.url) as client:
            first, second = await env.run_group(env.dataset[0], client, "fake-model", {}, n=2)
    for rollout in (first, second):
        tools = [m["content"] for m in rollout.completion if m["role"] == "tool"]
        assert tools[0] == "False\n"  # the other rollout's variables are not visible
        assert "TimeoutError" in tools[1] and "restarted" in tools[1]
        assert "NameError" in tools[2]  # the restart lost the state
        assert rollout.reward == 0.0 and rollout.error is None
