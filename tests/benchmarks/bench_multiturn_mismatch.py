"""Trainer/engine mismatch on multi-turn rollouts: message path versus token path, same seeds.

One vLLM CPU server (tiny Qwen3, seed 0) and one trainer; the same multi-turn environment (the
user says "again" after each model turn, 3 model turns) is rolled out with the same per-rollout
seeds twice: with chat messages re-rendered by the server each turn (the path before token
in/token out) and with token-id prompts. The trainer recomputes logprobs on each rollout's
training sample; reported per path: the k3 KL estimate of KL(pi_inf || pi_old) over the
sample's model tokens (the trainer's `mismatch_kl`), the fraction of rollouts whose turns were
exact token continuations, and the fraction of all sampled model tokens that the training sample
still contains (the message path loses the turns whose re-rendered history diverged).

    python tests/benchmarks/bench_multiturn_mismatch.py [--rollouts 32] [--turns 3]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from rlkit.envs import MultiTurnEnv, Rollout
from rlkit.inference import ServerProcess, start_server
from rlkit.models import init_tiny
from rlkit.trainer.config import ModelConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.trainer import Trainer

STOPS = list(range(300, 400))


class Again(MultiTurnEnv):
    async def env_response(self, messages, state) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"again, turn {state['turn'] + 1}"}]


async def rollouts(
    server: ServerProcess, model: str, token_prompts: bool, n: int, turns: int
) -> list[Rollout]:
    data = Dataset.from_dict({"question": ["Reverse the text: hello world"], "answer": [""]})
    env = Again(dataset=data, max_turns=turns)
    row = env.get_dataset()[0]
    async with server.client(token_prompts=token_prompts) as client:
        return list(
            await asyncio.gather(
                *(
                    env.rollout(
                        row,
                        client,
                        model,
                        # end turns on any of 100 token ids: the random model rarely ends
                        # its turns, and a logit bias would change the engine's logprobs
                        {"max_tokens": 32, "seed": seed, "stop_token_ids": STOPS},
                    )
                    for seed in range(n)
                )
            )
        )


def mismatch(trainer: Trainer, batch: list[Rollout]) -> dict[str, float]:
    k3_sum = tokens = 0.0
    for rollout in batch:
        sample = rollout.training_sample()
        seq = TokenSequence(sample.token_ids, sample.loss_mask, sample.inference_logprobs)
        (mb,) = make_micro_batches([seq], 8192)
        with torch.no_grad():
            lp, _ = trainer.logprobs(mb)
        train = lp[0, : len(sample.token_ids) - 1]
        mask = torch.tensor(sample.loss_mask[1:], dtype=torch.bool)
        infer = torch.tensor(sample.inference_logprobs[1:])
        delta = (train - infer)[mask]
        k3_sum += float((torch.exp(delta) - delta - 1).sum())
        tokens += int(mask.sum())
    sampled = sum(len(t.completion_token_ids) for r in batch for t in r.turns)
    return {
        "mismatch_kl_k3": k3_sum / max(tokens, 1),
        "exact_continuation_frac": sum(r.exact_continuation for r in batch) / len(batch),
        "sampled_tokens_in_sample_frac": tokens / max(sampled, 1),
        "turns_per_rollout": sum(len(r.turns) for r in batch) / len(batch),
        "errors": sum(r.error is not None for r in batch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(init_tiny(Path(tmp) / "tiny", arch="qwen3", seed=0))
        server = start_server(model, log_path=Path(tmp) / "vllm.log")
        trainer = Trainer(
            TrainerConfig(run_dir=str(Path(tmp) / "run"), model=ModelConfig(path=model)),
            total_steps=1,
        )
        try:
            server.wait_ready(timeout=600)
            result: dict[str, Any] = {"rollouts": args.rollouts, "max_turns": args.turns}
            for name, token_prompts in (("messages", False), ("tokens", True)):
                batch = asyncio.run(
                    rollouts(server, model, token_prompts, args.rollouts, args.turns)
                )
                assert all(r.prompt_mode == name for r in batch)
                result[name] = mismatch(trainer, batch)
        finally:
            trainer.close()
            server.stop()
    result["kl_ratio_messages_over_tokens"] = result["messages"]["mismatch_kl_k3"] / max(
        result["tokens"]["mismatch_kl_k3"], 1e-12
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
