"""Environment rollouts against the real vLLM CPU server (shared session fixture, tiny model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.envs import MultiTurnEnv, Rollout, load_environment

pytestmark = pytest.mark.slow


def _check_engine_record(rollout: Rollout) -> None:
    assert rollout.error is None, rollout.error
    for turn in rollout.turns:
        assert turn.prompt_token_ids and turn.completion_token_ids
        assert len(turn.completion_logprobs) == len(turn.completion_token_ids)
        assert all(lp <= 0.0 for lp in turn.completion_logprobs)
        assert turn.finish_reason in ("stop", "length")
        assert turn.policy_version_end is not None
    sample = rollout.training_sample()
    tokens, mask, logprobs = sample.token_ids, sample.loss_mask, sample.inference_logprobs
    last = rollout.turns[-1]
    assert tokens == last.prompt_token_ids + last.completion_token_ids
    assert len(mask) == len(logprobs) == len(tokens)
    assert sum(mask) >= len(last.completion_token_ids)
    assert rollout.usage["completion_tokens"] == sum(
        len(t.completion_token_ids) for t in rollout.turns
    )


async def test_reverse_text_rollouts(vllm_server: Any, tiny_model_dir: Path) -> None:
    env = load_environment("reverse-text", num_train_examples=4, num_eval_examples=2)
    row = env.get_eval_dataset()[0]
    async with vllm_server.client() as client:
        rollouts = await env.run_group(row, client, str(tiny_model_dir), {"max_tokens": 12}, n=3)
    for rollout in rollouts:
        _check_engine_record(rollout)
        assert len(rollout.turns) == 1 and len(rollout.turns[0].completion_token_ids) <= 12
        assert 0.0 <= rollout.reward <= 1.0 and set(rollout.metrics) == {
            "reversal_reward",
            "exact_match",
        }


async def test_math_rollouts(vllm_server: Any, tiny_model_dir: Path) -> None:
    env = load_environment("math", dataset="gsm8k", num_examples=2, verify_workers=1)
    row = env.get_eval_dataset()[0]
    try:
        async with vllm_server.client() as client:
            rollouts = await env.run_group(
                row, client, str(tiny_model_dir), {"max_tokens": 16}, n=2
            )
    finally:
        env.verifier.close()
    for rollout in rollouts:
        _check_engine_record(rollout)
        assert rollout.metrics.keys() == {"correct_answer", "boxed_answer"}


class Echo(MultiTurnEnv):
    async def env_response(self, messages, state) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "again"}]


async def test_multi_turn_rollout_concatenates_turns(
    vllm_server: Any, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    end = AutoTokenizer.from_pretrained(tiny_model_dir).convert_tokens_to_ids("<|im_end|>")
    base = load_environment("reverse-text", num_train_examples=4, num_eval_examples=1)
    env = Echo(dataset=base.get_dataset(), rubric=base.rubric, max_turns=3)
    # favour the end-of-turn token so the random model finishes its turns and the env replies
    sampling = {"max_tokens": 24, "logit_bias": {str(end): 6.0}}
    async with vllm_server.client() as client:
        rollouts = await env.run_group(
            env.get_dataset()[0], client, str(tiny_model_dir), sampling, 4
        )
    assert max(len(r.turns) for r in rollouts) > 1
    for rollout in rollouts:
        _check_engine_record(rollout)
        assert rollout.prompt_mode == "tokens" and rollout.exact_continuation
        assert all(t.finish_reason == "stop" for t in rollout.turns[:-1])
        assert len(rollout.turns) == 3 or rollout.turns[-1].finish_reason == "length"
        assert [m["role"] for m in rollout.completion][1::2] == ["user"] * (len(rollout.turns) - 1)
