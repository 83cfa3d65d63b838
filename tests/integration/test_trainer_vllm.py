"""Exported weights load into a running vLLM CPU server and reproduce the trainer's logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from rlkit.trainer.engine import Trainer
from rlkit.trainer.export import weights_dir
from rlkit.trainer.packing import Sequence, make_micro_batches
from rlkit.trainer.sft import sft_loss


def train_a_little(trainer: Trainer, steps: int = 4) -> None:
    """A few high-lr SFT steps so the exported policy clearly differs from the served one."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(8):
        ids = torch.randint(0, 1000, (24,), generator=g).tolist()
        seqs.append(Sequence(ids, [0] * 8 + [1] * 16, [0.0] * 24))
    for _ in range(steps):
        assert not trainer.train_step(seqs, sft_loss, normalizer=8 * 15.0).skipped


def trainer_logprobs(trainer: Trainer, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = prompt + completion
    seq = Sequence(ids, [0] * len(prompt) + [1] * len(completion), [0.0] * len(ids))
    (mb,) = make_micro_batches([seq], 4096)
    with torch.no_grad():
        lp, _ = trainer.logprobs(mb)
    return lp[0, len(prompt) - 1 :]


@pytest.mark.slow
async def test_exported_weights_served_with_trainer_logprobs(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rlkit.inference import InferenceClient, start_server

    model = str(tiny_model_dir)
    server = start_server(model, log_path=tmp_path / "vllm.log")  # our own: weights change
    trainer = Trainer(
        TrainerConfig(
            run_dir=str(tmp_path / "run"),
            model=ModelConfig(path=model),
            optim=OptimConfig(lr=1e-2),
        ),
        total_steps=4,
    )
    try:
        train_a_little(trainer)
        exported = trainer.export(weights_dir(tmp_path / "run", 4))
        assert exported is not None and (exported / "STABLE").exists()
        server.wait_ready(timeout=600)
        async with InferenceClient(server.url) as client:
            prompt = trainer.tokenizer("<|im_start|>user\nreverse abc<|im_end|>\n")["input_ids"]
            sampling = {"max_tokens": 24, "temperature": 1.0, "seed": 0, "ignore_eos": True}
            before = await client.completion(prompt, model, sampling)
            version = await client.update_weights(str(exported), version=4)
            assert version == 4
            gen = await client.completion(prompt, model, sampling)
        assert gen.policy_version_end == 4 and len(gen.completion_token_ids) == 24
        served = torch.tensor(gen.completion_logprobs)
        ours = trainer_logprobs(trainer, prompt, gen.completion_token_ids)
        diff = (served - ours).abs()
        print(f"served vs trainer logprobs: max {diff.max():.4f} mean {diff.mean():.4f}")
        assert diff.max() < 0.15 and diff.mean() < 0.05, diff  # bf16 serving vs fp32 trainer
        old = trainer_logprobs(trainer, prompt, before.completion_token_ids)
        stale = (torch.tensor(before.completion_logprobs) - old).abs().mean()
        assert stale > 5 * diff.mean()  # the server really changed policy
    finally:
        trainer.close()
        server.stop()
