"""Rollout loops against the fake OpenAI server: multi-turn, tools, env groups, failures."""

from __future__ import annotations

import json
from typing import Any

import pytest
from datasets import Dataset

from rlkit.envs import EnvGroup, MultiTurnEnv, Rubric, SingleTurnEnv, ToolEnv
from rlkit.envs.tools import parse_tool_calls, tool_schema
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer

QUESTIONS = Dataset.from_dict({"question": ["abc", "hello"], "answer": ["cba", "olleh"]})


class CountdownEnv(MultiTurnEnv):
    """The environment says 'again' until the model has spoken `state['needed']` times."""

    def init_state(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**super().init_state(row), "needed": 3}

    async def is_completed(self, messages, state) -> bool:
        return state["turn"] >= state["needed"]

    async def env_response(self, messages, state) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"again {state['turn']}"}]


def turns_replied(completion) -> float:
    return float(sum(m["role"] == "assistant" for m in completion))


async def test_multi_turn_loop_records_every_turn() -> None:
    env = CountdownEnv(dataset=QUESTIONS, rubric=Rubric([turns_replied]), max_turns=5)
    with FakeOpenAIServer() as server:
        async with InferenceClient(server.url) as client:
            (rollout,) = await env.run_group(env.get_dataset()[0], client, "fake-model", {}, n=1)
    assert [m["role"] for m in rollout.completion] == ["assistant", "user"] * 2 + ["assistant"]
    assert rollout.completion[-1]["content"] == "2 niaga"  # the fake reverses the last user turn
    assert len(rollout.turns) == 3 and rollout.reward == 3.0 and rollout.error is None
    for turn in rollout.turns:
        assert len(turn.completion_logprobs) == len(turn.completion_token_ids) > 0
    sample = rollout.training_sample()
    tokens, mask, logprobs = sample.token_ids, sample.loss_mask, sample.inference_logprobs
    assert len(tokens) == len(mask) == len(logprobs) and sum(mask) > 0
    assert rollout.usage["completion_tokens"] == sum(
        len(t.completion_token_ids) for t in rollout.turns
    )
    assert {"generation_s", "env_s", "scoring_s", "total_s"} <= set(rollout.timings)
    assert len(rollout.state["responses"]) == 3


async def test_max_turns_and_length_stop_the_loop() -> None:
    env = CountdownEnv(dataset=QUESTIONS, max_turns=2)
    with FakeOpenAIServer(responder=lambda body: "a long reply that will be cut") as server:
        async with InferenceClient(server.url) as client:
            capped = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
            cut = await env.rollout(env.get_dataset()[0], client, "fake-model", {"max_tokens": 4})
        assert server.requests[-1]["max_tokens"] == 4
    assert len(capped.turns) == 2 and capped.finish_reason == "stop"
    assert len(cut.turns) == 1 and cut.finish_reason == "length" and cut.error is None
    assert len(cut.turns[0].completion_token_ids) == 4


async def test_sampling_defaults_are_overridden_by_the_caller() -> None:
    env = SingleTurnEnv(dataset=QUESTIONS, sampling_defaults={"temperature": 0.3, "top_p": 0.9})
    with FakeOpenAIServer() as server:
        async with InferenceClient(server.url) as client:
            await env.rollout(env.get_dataset()[0], client, "fake-model", {"temperature": 1.0})
        body = server.requests[-1]
    assert body["temperature"] == 1.0 and body["top_p"] == 0.9


async def test_failures_are_recorded_not_raised() -> None:
    class BrokenEnv(MultiTurnEnv):
        async def env_response(self, messages, state):
            raise KeyError("no such board")

    broken = BrokenEnv(dataset=QUESTIONS)
    single = SingleTurnEnv(dataset=QUESTIONS)
    with FakeOpenAIServer() as server:
        async with InferenceClient(server.url) as client:
            env_failed = await broken.rollout(broken.get_dataset()[0], client, "fake-model", {})
    async with InferenceClient("http://127.0.0.1:9", max_retries=0) as client:
        gen_failed = await single.rollout(single.get_dataset()[0], client, "fake-model", {})
    assert env_failed.error == "environment error: KeyError: 'no such board'"
    assert gen_failed.error is not None and gen_failed.error.startswith("generation failed")
    assert gen_failed.turns == []


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


async def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: Numerator.
        b: Denominator.
    """
    return a / b


def test_tool_schema_from_signature_and_docstring() -> None:
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first addend."},
                    "b": {"type": "integer", "description": "The second addend."},
                },
                "required": ["a", "b"],
            },
        },
    }


def test_tool_calls_parsed_from_text_and_from_the_server() -> None:
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> <tool_call>{bad'
    )
    (call,) = parse_tool_calls({"role": "assistant", "content": text})
    assert (call.name, call.arguments, call.error) == ("add", {"a": 1, "b": 2}, None)
    (bad,) = parse_tool_calls({"content": "<tool_call>{bad}</tool_call>"})
    assert bad.error and bad.error.startswith("malformed tool call")
    server_side = {
        "tool_calls": [{"id": "x", "function": {"name": "add", "arguments": '{"a": 5}'}}]
    }
    assert parse_tool_calls(server_side)[0].arguments == {"a": 5}


def tool_script(body: dict[str, Any]) -> str | dict[str, Any]:
    """First turn: call tools (server-side for 'server', as text otherwise); then echo results."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        results = [m["content"] for m in messages if m["role"] == "tool"]
        return "results: " + " | ".join(results)
    if messages[-1]["content"] == "server":
        call = {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}
        return {"content": "", "tool_calls": [{"id": "c1", "type": "function", "function": call}]}
    return (
        '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>'
        '<tool_call>{"name": "divide", "arguments": {"a": 6, "b": 4}}</tool_call>'
    )


async def test_tool_round_trip() -> None:
    data = Dataset.from_dict({"question": ["server", "text"], "answer": ["5", "1.5"]})
    env = ToolEnv(tools=[add, divide], dataset=data, max_turns=4)
    with FakeOpenAIServer(responder=tool_script) as server:
        async with InferenceClient(server.url) as client:
            via_server = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
            via_text = await env.rollout(env.get_dataset()[1], client, "fake-model", {})
        assert [t["function"]["name"] for t in server.requests[0]["tools"]] == ["add", "divide"]
    assert [m["role"] for m in via_server.completion] == ["assistant", "tool", "assistant"]
    assert via_server.completion[1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "add",
        "content": "5",
    }
    assert via_server.completion[-1]["content"] == "results: 5"
    results = [m["content"] for m in via_text.completion if m["role"] == "tool"]
    assert results[0] == "Error: divide raised ZeroDivisionError: float division by zero"
    assert results[1].startswith("Error: unknown tool 'nope'")
    assert results[2] == (
        "Error: invalid arguments for add: a: Input should be a valid integer, "
        "unable to parse string as an integer; b: Missing required argument"
    )
    assert results[3] == "1.5"
    assert len(via_text.turns) == 2 and via_text.error is None


async def test_env_group_routes_rows_rollouts_and_scoring() -> None:
    def one() -> float:
        return 1.0

    def two(answer) -> float:
        return 2.0 if answer == "cba" else -1.0

    first = SingleTurnEnv(dataset=QUESTIONS.select([0]), rubric=Rubric([one]))
    second = SingleTurnEnv(dataset=QUESTIONS, rubric=Rubric([two]), sampling_defaults={"seed": 7})
    group = EnvGroup([first, second], env_ids=["first", "second"])
    rows = group.get_dataset()
    assert len(rows) == 3 and list(rows["example_id"]) == [0, 1, 2]
    assert [r["env_id"] for r in rows["info"]] == ["first", "second", "second"]
    assert rows[2]["info"]["env_example_id"] == 1
    with FakeOpenAIServer() as server:
        async with InferenceClient(server.url) as client:
            a = await group.run_group(rows[0], client, "fake-model", {}, n=2)
            b = await group.run_group(rows[1], client, "fake-model", {}, n=1)
        assert "seed" not in server.requests[0] and server.requests[-1]["seed"] == 7
    assert [(r.env_id, r.reward, r.metrics) for r in a] == [("first", 1.0, {"one": 1.0})] * 2
    assert (b[0].env_id, b[0].reward) == ("second", 2.0)
    with pytest.raises(ValueError, match="distinct"):
        EnvGroup([first, second], env_ids=["x", "x"])
