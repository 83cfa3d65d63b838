"""math-python: the math rubric rewards an answer the model computed with the python tool."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlkit.envs import load_environment
from rlkit.envs.python_tool import PythonToolEnv
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.system

CELLS = ["eggs = 16 - 3 - 4", "eggs * 2"]


def tool_using_model(body: dict[str, Any]) -> dict[str, Any]:
    tool_outputs = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if len(tool_outputs) < len(CELLS):
        code = CELLS[len(tool_outputs)]
        call = {"name": "python", "arguments": json.dumps({"code": code})}
        return {"content": "", "tool_calls": [{"id": "c", "type": "function", "function": call}]}
    return {"content": f"<think>done</think>So she makes \\boxed{{{tool_outputs[-1].strip()}}}."}


async def test_gsm8k_item_solved_with_the_python_tool() -> None:
    env = load_environment("math-python", dataset="gsm8k", num_examples=1)
    assert isinstance(env, PythonToolEnv) and env.env_id == "math-python"
    assert env.tool_schemas[0]["function"]["name"] == "python"
    row = env.get_eval_dataset()[0]
    assert row["answer"] == "18"
    try:
        with FakeOpenAIServer(responder=tool_using_model) as server:
            client = InferenceClient(server.url)
            [rollout] = await env.run_group(row, client, "fake-model", {}, n=1)
    finally:
        env.verifier.close()
    assert rollout.error is None, rollout.error
    assert [m["content"] for m in rollout.completion if m["role"] == "tool"] == [
        "(no output)",
        "18\n",
    ]
    assert rollout.reward == 1.0


async def test_math_exploits_through_the_tool_env_earn_nothing() -> None:
    from rlkit.envs.check import play

    env = load_environment("math-python", dataset="gsm8k", num_examples=3)
    names = {e.name for e in env.exploits}
    assert {"many values", "catch-all", "formatting tricks", "tool then guess"} <= names
    try:
        for row in env.get_eval_dataset():
            for exploit in env.exploits:
                for name, script in exploit.variants(env, row).items():
                    rollout, _ = await play(env, row, script, repeat=True)
                    assert rollout.reward == 0.0, (exploit.name, name)
    finally:
        env.verifier.close()
