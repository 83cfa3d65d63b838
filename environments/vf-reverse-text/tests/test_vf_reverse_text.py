"""The verifiers-API environment runs unmodified through rlkit's adapter."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from rlkit.envs import Environment, load_environment  # noqa: E402
from rlkit.envs.vf_adapter import VerifiersEnv  # noqa: E402
from rlkit.inference import InferenceClient  # noqa: E402
from tests.fakes.fake_openai import FakeOpenAIServer  # noqa: E402


def xml_reverser(body: dict) -> str:
    text = body["messages"][-1]["content"]
    return f"<think>\nreverse it\n</think>\n<answer>\n{text[::-1]}\n</answer>"


async def test_verifiers_environment_is_wrapped_and_scored() -> None:
    env = load_environment("vf-reverse-text", num_train_examples=4, num_eval_examples=2)
    assert isinstance(env, VerifiersEnv) and isinstance(env, Environment)
    assert env.env_id == "vf-reverse-text" and env.max_turns >= 1
    rows = env.get_eval_dataset()
    assert len(rows) == 2 and rows[0]["prompt"][0]["role"] == "system"
    assert "<answer>" in rows[0]["prompt"][0]["content"]
    with FakeOpenAIServer(responder=xml_reverser) as server:
        async with InferenceClient(server.url) as client:
            perfect = await env.run_group(rows[0], client, "fake-model", {}, n=2)
        assert "n" not in server.requests[0]  # verifiers' sampling "n" is not forwarded
    with FakeOpenAIServer() as server:  # plain reversal without the XML format
        async with InferenceClient(server.url) as client:
            (plain,) = await env.run_group(rows[0], client, "fake-model", {}, n=1)
    for rollout in perfect:
        assert rollout.error is None and len(rollout.turns) == 1
        assert rollout.metrics == {"lcs_reward_func": 1.0, "format_reward_func": 1.0}
        assert rollout.reward == pytest.approx(1.2)
        assert len(rollout.turns[0].completion_logprobs) == len(
            rollout.turns[0].completion_token_ids
        )
    assert plain.metrics["lcs_reward_func"] == 0.0 and plain.reward < 0.2
