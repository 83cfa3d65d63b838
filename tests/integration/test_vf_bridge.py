"""verifiers environments through `rlkit eval` over the bridge, against the fake server.

Each environment runs in a worker inside a cached venv with its own verifiers version
(`RLKIT_BRIDGE_VENVS`, built once per checkout by the first test that needs it). The fixtures
are written from each version's own API: vf-reverse-text (0.1.3 single-turn), vf-calc-classic
(0.1.3 tool env, `setup_state`), vf-calc-state (0.1.9 state loop, `@vf.stop`), vf-calc-v02
(0.2.0 client layer), vf-calc-v03 (0.3.1, `verifiers.legacy`), vf-calc-v04 (0.4.0 taskset
package, MCP tool server, local chat agent).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import bridge_workers, clean_rollouts, only_run_dir, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.scripted_replies import calculator

pytestmark = pytest.mark.venv

ENV_PATH = str(Path(__file__).parent / "envs")


def _eval(monkeypatch, capsys, tmp_path: Path, url: str, env_id: str, *extra: str):
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    out = tmp_path / "runs"
    code, text = run_cli(
        monkeypatch,
        capsys,
        "eval",
        env_id,
        "-m",
        "fake-model",
        "-b",
        url,
        "-o",
        str(out),
        "-t",
        "256",
        *extra,
    )
    return code, text, out


def _errors_by_example(out: Path) -> dict[int, str | None]:
    """Each example's rollout error of a completed single-rollout run."""
    from rlkit.eval import load_run

    run = load_run(only_run_dir(out))
    assert run.metadata.status == "complete"
    return {r.example_index: r.rollout.error for r in run.results}


def _assert_token_turns(rollouts: list, turns: int) -> None:
    for rollout in rollouts:
        assert len(rollout.turns) == turns
        for turn in rollout.turns:
            assert turn.prompt_token_ids and turn.completion_token_ids
            assert len(turn.completion_logprobs) == len(turn.completion_token_ids)


@pytest.mark.parametrize(
    ("env_id", "args", "turns", "reward", "metrics"),
    [
        ("vf-reverse-text", '{"num_eval_examples": 2}', 1, 1.2, {"lcs_reward_func": 1.0}),
        ("vf-calc-classic", "{}", 2, 1.5, {"correct": 1.0, "used_tool": 1.0}),
        ("vf-calc-state", "{}", 2, 1.0, {"correct": 1.0, "turns": 2.0, "add_calls": 1.0}),
        ("vf-calc-v02", "{}", 2, 1.0, {"correct": 1.0, "add_calls": 1.0}),
        ("vf-calc-v03", "{}", 2, 1.0, {"correct": 1.0, "add_calls": 1.0, "tool_calls_made": 1.0}),
        ("vf-calc-v04", "{}", 2, 1.0, {"correct": 1.0, "add_calls": 1.0}),
    ],
)
def test_verifiers_envs_run_through_rlkit_eval(
    monkeypatch, capsys, tmp_path, env_id, args, turns, reward, metrics
) -> None:
    vllm_args = {"min_tokens": 1, "top_k": 50}  # vLLM's, not OpenAI's: verifiers' client refuses
    with FakeOpenAIServer(responder=calculator) as server:
        code, text, out = _eval(
            monkeypatch, capsys, tmp_path, server.url, env_id,
            "-n", "2", "-r", "2", "-a", args, "-S", json.dumps(vllm_args),
        )  # fmt: skip
    assert code in (0, None), text
    assert server.requests
    assert all(body.items() >= vllm_args.items() for body in server.requests)
    rollouts = clean_rollouts(out, expected=4)
    _assert_token_turns(rollouts, turns)
    for rollout in rollouts:
        assert rollout.reward == pytest.approx(reward)
        assert {k: rollout.metrics[k] for k in metrics} == metrics
    if turns > 1:  # the tool's reply is in the conversation verifiers built
        assert [m["role"] for m in rollouts[0].completion] == ["assistant", "tool", "assistant"]
        assert rollouts[0].completion[0]["tool_calls"][0]["function"]["name"] == "add"
    assert "verifiers" not in sys.modules  # rlkit's process never imports it
    assert bridge_workers() == []  # the eval closed its environment: no worker outlives it


def test_verifiers_version_override_and_no_fit(monkeypatch, capsys, tmp_path) -> None:
    with FakeOpenAIServer(responder=calculator) as server:
        code, text, out = _eval(
            monkeypatch,
            capsys,
            tmp_path,
            server.url,
            "vf-reverse-text",
            "-n",
            "1",
            "-r",
            "1",
            "--verifiers-version",
            "0.1.9.post3",
        )
        assert code in (0, None), text
        (rollout,) = clean_rollouts(out, expected=1)
        assert rollout.metrics["num_turns"] == 1.0  # a metric only 0.1.9's rubric adds
        code, text, _ = _eval(
            monkeypatch,
            capsys,
            tmp_path,
            server.url,
            "vf-reverse-text",
            "--verifiers-version",
            "0.5.0",
        )
    assert code == 2 and "0.5.0 is in no supported era" in text
    assert "0.1.3.post0" in text  # the tested versions are named


def _eval_with_failure(monkeypatch, capsys, tmp_path, failure: str) -> dict[int, str | None]:
    """4 examples one rollout at a time; example 1's tool call crashes or blocks the worker."""
    with FakeOpenAIServer(responder=calculator) as server:
        args = json.dumps({failure: "What is 3 + 4?"})
        code, text, out = _eval(
            monkeypatch, capsys, tmp_path, server.url, "vf-calc-classic",
            "-n", "4", "-r", "1", "-c", "1", "-a", args, "--allow-errors",
        )  # fmt: skip
    assert code in (0, None), text
    return _errors_by_example(out)


def _only_hit_in_flight_work(errors: dict[int, str | None], reason: str) -> None:
    assert reason in (errors[1] or ""), errors
    # example 0's scoring may still have been in flight; later examples get a new worker
    assert errors[0] is None or reason in errors[0], errors
    assert errors[2] is None and errors[3] is None, errors


def test_crashing_worker_errors_its_rollout_and_restarts(monkeypatch, capsys, tmp_path) -> None:
    errors = _eval_with_failure(monkeypatch, capsys, tmp_path, "crash_on")
    _only_hit_in_flight_work(errors, "exited with code 3")


def test_hanging_worker_is_killed_and_restarted(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("RLKIT_BRIDGE_PING_S", "0.5")
    monkeypatch.setenv("RLKIT_BRIDGE_PING_TIMEOUT_S", "3")
    errors = _eval_with_failure(monkeypatch, capsys, tmp_path, "hang_on")
    _only_hit_in_flight_work(errors, "did not answer a ping")
