"""deep-research through the paths users run, against the real vLLM CPU server with the tiny
model: `rlkit eval deep-research` (no errored rollouts) and a few `rlkit train` steps."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rlkit.envs import load_environment
from rlkit.eval import load_run
from tests.helpers.cli import only_run_dir, run_cli, tiny_train_cmd
from tests.helpers.session_server import on_session_server

pytestmark = pytest.mark.slow


def test_eval_against_the_real_tiny_model(
    vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys
) -> None:
    code, output = run_cli(
        monkeypatch, capsys, "eval", "deep-research", "-m", str(tiny_model_dir),
        "-b", vllm_server.url, "--token-file", str(vllm_server.token_file),
        "-n", "4", "-r", "2", "-t", "32",
        "-a", '{"num_train_examples": 4, "max_turns": 3}', "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0, output
    run = load_run(only_run_dir(tmp_path / "out"))
    assert len(run.results) == 8 and run.metadata.summary["errors"] == 0
    for result in run.results:
        rollout = result.rollout
        assert rollout.error is None, rollout.error
        assert 0.0 <= rollout.reward <= 1.0
        assert 1 <= len(rollout.turns) <= 3 and rollout.turns[0].completion_token_ids
        assert {"correct_answer", "answer_f1", "support_recall", "tool_errors"} <= set(
            rollout.metrics
        )


async def test_tool_turns_through_the_real_engine(vllm_server, tiny_model_dir: Path) -> None:
    """The random model, nudged towards `<tool_call>` tags, sends (malformed) tool calls: the
    environment answers with tool errors and the rollout goes on, token ids in and out."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>", "<|im_end|>"])
    # the tags almost every token, the turn's end a little less often: an open tag, a close tag
    # and the end of the turn in that order within 48 tokens (an equal nudge of 5.0 on all three
    # gave 23 tool turns in 128 rollouts: none in 16 one run in 25)
    bias = dict(zip(ids, (12.0, 12.0, 9.5), strict=True))
    sampling = {"max_tokens": 48, "logit_bias": {str(i): b for i, b in bias.items()}}
    env = load_environment("deep-research", num_train_examples=2, max_turns=3)
    row = env.get_eval_dataset()[0]
    async with vllm_server.client() as client:
        rollouts = await env.run_group(row, client, str(tiny_model_dir), sampling, 16)
    assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
    # 96 of 128 rollouts made a tool turn with this nudge: none in 16 is ~1e-10
    multi = [r for r in rollouts if len(r.turns) > 1]
    assert multi, [r.completion for r in rollouts]
    for rollout in multi:
        assert rollout.prompt_mode == "tokens"
        replies = [m["content"] for m in rollout.completion if m["role"] == "tool"]
        assert replies and rollout.metrics["tool_errors"] == sum(
            r.startswith("Error:") for r in replies
        )
        tokens = rollout.training_sample()
        assert len(tokens.token_ids) == len(tokens.loss_mask)


def test_train_a_few_steps(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    # on the session's server: its context is the model's 4,096 tokens, what multi-turn needs
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir, run_dir, *urls,
            "--env.0.id=deep-research",
            "--env.0.args={ num_train_examples = 64, num_eval_examples = 4, max_turns = 2 }",
            "--orchestrator.max_steps=2",
            "--orchestrator.c3po.capacity=16",
            "--orchestrator.c3po.token_budget=128",
            "--orchestrator.drop_zero_advantage=false",  # an untrained model solves nothing
            "--orchestrator.eval.at_start=false",
            "--orchestrator.eval.examples=4",
            "--orchestrator.eval.rollouts_per_example=1",
            "--ckpt.interval=0",
            "--log.plot=false",
        )  # fmt: skip
        with open(log, "w") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert done.returncode == 0, log.read_text()[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    # a step may train only on rollouts finished earlier (C3PO++), so not every step has new ones
    assert any("reward_mean/deep-research" in r for r in records), records
    assert sum(r["rollouts_errored"] for r in records) == 0
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(e["step"], e["env_id"]) for e in evals] == [(2, "deep-research")], evals
    assert evals[0]["errors"] == 0
