"""Exported weights load into a running vLLM CPU server and reproduce the trainer's logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.protocol.layout import RunLayout
from rlkit.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.trainer import Trainer
from tests.helpers.session_server import serve_base
from tests.helpers.trainer_logprobs import train_a_little, trainer_logprobs


@pytest.mark.slow
async def test_exported_weights_served_with_trainer_logprobs(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rlkit.inference.admin import AdminClient

    model = str(tiny_model_dir)
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
        exported = trainer.export(RunLayout(tmp_path / "run").weights_version(4), version=4)
        assert exported is not None and (exported / "STABLE").exists()
        async with vllm_server.client() as client:
            prompt = trainer.tokenizer("<|im_start|>user\nreverse abc<|im_end|>\n")["input_ids"]
            sampling = {"max_tokens": 24, "temperature": 1.0, "seed": 0, "ignore_eos": True}
            before = await client.completion(prompt, model, sampling)
            try:
                version = await AdminClient(client).update_weights(str(exported), version=4)
                assert version == 4
                gen = await client.completion(prompt, model, sampling)
            finally:  # the session server is shared: serve the original weights again
                await serve_base(vllm_server, tiny_model_dir)
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


def k3(trainer: Trainer, prompt: list[int], gens: list, temperature: float) -> float:
    """Mean k3 = k - 1 - log k, k = pi_old / pi_inf, over the sampled tokens."""
    values = []
    for gen in gens:
        ids = prompt + gen.completion_token_ids
        mask = [0] * len(prompt) + [1] * len(gen.completion_token_ids)
        seq = TokenSequence(ids, mask, [0.0] * len(ids), temperature=temperature)
        (mb,) = make_micro_batches([seq], 4096)
        with torch.no_grad():
            ours = trainer.logprobs(mb)[0][0, len(prompt) - 1 :]
        delta = ours - torch.tensor(gen.completion_logprobs)
        values.append(torch.exp(delta) - delta - 1)
    return float(torch.cat(values).mean())


@pytest.mark.slow
async def test_trainer_scores_tokens_at_the_sampling_temperature(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """k3 between trainer and vLLM at temperature 0.7 stays at its temperature-1 level."""
    from rlkit.inference.admin import AdminClient

    model = str(tiny_model_dir)
    trainer = Trainer(
        TrainerConfig(
            run_dir=str(tmp_path / "run"), model=ModelConfig(path=model), optim=OptimConfig(lr=1e-2)
        ),
        total_steps=4,
    )
    try:
        train_a_little(trainer)  # a peaked policy: temperature changes its distribution a lot
        exported = trainer.export(RunLayout(tmp_path / "run").weights_version(4), version=4)
        prompt = trainer.tokenizer("<|im_start|>user\nreverse abc<|im_end|>\n")["input_ids"]
        gens: dict[float, list] = {}
        async with vllm_server.client() as client:
            admin = AdminClient(client)
            await admin.update_weights(str(exported), version=4)
            try:
                for temperature in (1.0, 0.7):
                    gens[temperature] = [
                        await client.completion(
                            prompt,
                            model,
                            {"max_tokens": 24, "temperature": temperature, "seed": seed},
                        )
                        for seed in range(6)
                    ]
            finally:  # the session server is shared: serve the original weights again
                await serve_base(vllm_server, tiny_model_dir)
        at_1 = k3(trainer, prompt, gens[1.0], 1.0)
        at_07 = k3(trainer, prompt, gens[0.7], 0.7)
        unscaled = k3(trainer, prompt, gens[0.7], 1.0)  # what the trainer computed before
        print(
            f"k3 trainer vs vLLM: T=1 {at_1:.2e}, T=0.7 {at_07:.2e}, T=0.7 unscaled {unscaled:.2e}"
        )
        assert at_07 < 2 * at_1 + 1e-3
        assert unscaled > 10 * at_07
    finally:
        trainer.close()
