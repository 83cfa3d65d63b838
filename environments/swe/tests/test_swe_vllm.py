"""swe through the paths users run: `rlkit env check swe --gold` on a few tasks (all of them:
`rlkit env check swe --gold -n 200`, too heavy for CI), and, against the real vLLM CPU server
with the tiny model, `rlkit eval swe` (no errored rollouts) and a few `rlkit train` steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import clean_rollouts, run_cli, run_train, tiny_train_cmd
from tests.helpers.session_server import on_session_server

# Small limits: an untrained model's commands are short, its tool outputs stay small.
ENV_ARGS = {"max_turns": 2, "output_chars": 600, "command_timeout": 10}


@pytest.mark.system
def test_rlkit_env_check_gold(monkeypatch, capsys) -> None:
    code, output = run_cli(monkeypatch, capsys, "env", "check", "swe", "--gold", "-n", "3")
    assert code == 0, output


@pytest.mark.system
@pytest.mark.slow
def test_eval_against_the_real_tiny_model(
    vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys
) -> None:
    code, output = run_cli(
        monkeypatch, capsys, "eval", "swe", "-m", str(tiny_model_dir),
        "-b", vllm_server.url, "--token-file", str(vllm_server.token_file),
        "-n", "3", "-r", "2", "-t", "32",
        "-a", json.dumps({**ENV_ARGS, "repos": ["parse"]}), "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0, output
    rollouts = clean_rollouts(tmp_path / "out", expected=6)
    assert all(r.reward == 0.0 for r in rollouts)  # a random tiny model fixes nothing
    assert all(r.turns[0].completion_token_ids for r in rollouts)
    metrics = {"resolved", "fail_to_pass_fixed", "protected_files_modified", "tool_errors"}
    assert all(metrics <= set(r.metrics) for r in rollouts)


@pytest.mark.system
@pytest.mark.slow
def test_train_a_few_steps(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = "{ max_turns = 2, output_chars = 600, command_timeout = 10, num_examples = 16 }"
    # on the session's server: its context is the model's 4,096 tokens, what multi-turn needs
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir, run_dir, *urls,
            "--env.0.id=swe",
            f"--env.0.args={args}",
            "--orchestrator.max_steps=2",
            "--orchestrator.group_size=4",  # each rollout grades in a sandbox: few per step
            "--orchestrator.schedulers.c3po.capacity=4",  # one group in flight, as the steps
            "--orchestrator.schedulers.c3po.token_budget=64",
            "--orchestrator.drop_zero_advantage=false",  # an untrained model solves nothing
            "--orchestrator.eval.at_start=false",
            "--orchestrator.eval.examples=2",
            "--orchestrator.eval.rollouts_per_example=1",
            "--ckpt.interval=0",
            "--log.plot=false",
        )  # fmt: skip
        records = run_train(cmd, run_dir, tmp_path / "train.log")
    assert [r["step"] for r in records] == [1, 2]
    # a step's rewards are those of the groups that finished in it (with one group in flight,
    # step 2 may train a group that finished during step 1)
    assert "reward_mean/swe" in records[0] and all(r["batch_samples"] > 0 for r in records)
    assert sum(r["rollouts_errored"] for r in records) == 0
