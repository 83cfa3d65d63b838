"""A 4-turn tool rollout against the real vLLM CPU server: the trainer reproduces every logprob.

The rollout goes token in, token out; the trainer recomputes logprobs on the rollout's training
sample (exactly what the engine saw and sampled), and they match the engine's on every model
token of every turn, within the single-turn tolerance of test_trainer_vllm.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from rlkit.envs import ToolEnv
from rlkit.envs.tools import ToolCall, parse_tool_calls
from rlkit.trainer.config import ModelConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.trainer import Trainer

pytestmark = pytest.mark.slow


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class FourToolTurns(ToolEnv):
    """Four model turns; after each, the tool runs (the random tiny model cannot call it)."""

    async def is_completed(self, messages, state) -> bool:
        return state["turn"] >= 4

    async def env_response(self, messages, state) -> list[dict[str, Any]]:
        calls = parse_tool_calls(messages[-1]) or [
            ToolCall(f"call_{state['turn']}", "add", {"a": state["turn"], "b": 1})
        ]
        results = [await self.call_tool(call) for call in calls]
        return [
            {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r}
            for c, r in zip(calls, results, strict=True)
        ]


async def test_four_turn_tool_rollout_logprobs_match_the_trainer(
    vllm_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = str(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model)
    data = Dataset.from_dict({"question": ["What is 3 + 4? Use the tool."], "answer": ["7"]})
    env = FourToolTurns(tools=[add], dataset=data, max_turns=4)
    # the random model rarely samples its end of turn; stopping on any of 100 token ids ends its
    # turns without touching the distribution (a logit bias would change the engine's logprobs)
    stops = list(range(300, 400))
    sampling = {"max_tokens": 48, "temperature": 0.8, "seed": 3, "stop_token_ids": stops}
    async with vllm_server.client() as client:
        rollout = await env.rollout(env.get_dataset()[0], client, model, sampling)
    assert rollout.error is None, rollout.error
    assert rollout.prompt_mode == "tokens" and rollout.exact_continuation
    assert len(rollout.turns) == 4
    assert all(t.completion_token_ids[-1] in stops for t in rollout.turns[:3])
    assert [m["role"] for m in rollout.completion] == ["assistant", "tool"] * 3 + ["assistant"]

    assert [t.temperature for t in rollout.turns] == [0.8] * 4  # recorded with each request
    sample = rollout.training_sample()
    ids, mask = sample.token_ids, sample.loss_mask
    assert sum(mask) == sum(len(t.completion_token_ids) for t in rollout.turns)  # no truncation
    text = tokenizer.decode(ids)
    assert text.count("<tool_response>") == 3 and text.count("<|im_end|>") >= 7

    trainer = Trainer(
        TrainerConfig(run_dir=str(tmp_path / "run"), model=ModelConfig(path=model)),
        total_steps=1,
    )
    try:
        seq = TokenSequence(ids, mask, sample.inference_logprobs, temperature=sample.temperature)
        (mb,) = make_micro_batches([seq], 4096)
        with torch.no_grad():
            lp, _ = trainer.logprobs(mb)
    finally:
        trainer.close()
    ours = lp[0, : len(ids) - 1]  # position j predicts token j + 1
    for i, turn in enumerate(rollout.turns):
        start = len(turn.prompt_token_ids)
        n = len(turn.completion_token_ids)
        served = torch.tensor(turn.completion_logprobs)
        diff = (served - ours[start - 1 : start - 1 + n]).abs()
        print(f"turn {i}: {n} tokens, max {diff.max():.4f} mean {diff.mean():.4f}")
        assert diff.max() < 0.15 and diff.mean() < 0.05, (i, diff)  # bf16 engine, fp32 trainer
