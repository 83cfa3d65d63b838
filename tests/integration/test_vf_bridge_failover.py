"""A bridged rollout whose server dies runs again on another server of the orchestrator's pool.

The worker makes the model calls itself, so the pool's per-request failover cannot see them:
`BridgeEnv.rollout` asks the pool's client whether the server is down when the worker reports
`generation failed`, and if so reruns the rollout on a healthy server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlkit.envs import load_environment
from rlkit.inference.pool import ClientPool
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.scripted_replies import say_word

pytestmark = pytest.mark.venv

ENV_PATH = str(Path(__file__).parent / "envs")


def test_bridged_rollout_fails_over_to_a_healthy_server(monkeypatch) -> None:
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    env = load_environment("vf-string-prompt", verifiers_version="0.2.0")
    row = dict(env.get_eval_dataset(1)[0])
    logs: list[str] = []
    try:
        with (
            FakeOpenAIServer(responder=say_word) as dying,
            FakeOpenAIServer(responder=say_word) as healthy,
        ):
            pool = ClientPool([dying.url, healthy.url], log=logs.append)
            client = pool.next()
            assert client.base_url == dying.url.removesuffix("/v1")
            dying.stop()

            async def run():
                rollout = await env.rollout(row, client, "fake-model", {"max_tokens": 16})
                await env.score_group([rollout])
                await pool.aclose()
                return rollout

            rollout = asyncio.run(run())
    finally:
        env.close()
    assert rollout.error is None
    assert rollout.reward == 1.5 and len(rollout.turns) == 1
    assert client.base_url == healthy.url.removesuffix("/v1")
    assert pool.counters["failovers"] == 1 and pool.healthy == [False, True]
    assert any("is down" in line for line in logs), logs
