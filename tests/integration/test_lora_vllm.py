"""LoRA adapters trained under FSDP2 are served by a running vLLM CPU server by name.

One server (LoRA on: the session's `lora_server`) and one LoRA trainer: the trained adapter,
loaded as policy version 3 without a restart, reproduces the trainer's (base + adapter) logprobs
within the dense test's tolerance; a second adapter on the same server keeps its own version and
policy; `rlkit eval` evaluates an adapter by name; the update moves only adapter bytes; the
merged model (`rlkit model merge`) matches base + adapter in transformers and, loaded into the
same server's base weights, in vLLM.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from rlkit.inference.admin import AdminClient
from rlkit.inference.client import InferenceError
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.model import LoraConfig
from rlkit.protocol.weights import published_bytes
from rlkit.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from rlkit.trainer.trainer import Trainer
from tests.helpers.cli import RLKIT
from tests.helpers.eval_results import check_engine_results
from tests.helpers.published import publish_files
from tests.helpers.session_server import reset_lora_server
from tests.helpers.trainer_logprobs import train_a_little, trainer_logprobs

pytestmark = pytest.mark.xdist_group("lora-server")  # tests/helpers/scheduling.py
SAMPLING = {"max_tokens": 24, "temperature": 1.0, "seed": 0, "ignore_eos": True}


def hf_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Logprobs of `completion` after `prompt` under an HF model directory (transformers)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].log_softmax(-1)
    return logp.gather(-1, ids[0, 1:, None])[len(prompt) - 1 :, 0]


def close(served: list[float], ours: torch.Tensor, what: str) -> float:
    diff = (torch.tensor(served) - ours).abs()
    print(f"{what}: max {diff.max():.4f} mean {diff.mean():.4f}")
    assert diff.max() < 0.15 and diff.mean() < 0.05, diff  # bf16 serving vs fp32 trainer
    return float(diff.mean())


@pytest.mark.slow
async def test_adapter_served_by_name_matches_trainer_and_merge(
    lora_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = str(tiny_model_dir)
    server = lora_server
    run = tmp_path / "run"
    lora = LoraConfig(rank=8, alpha=16)
    trainer = Trainer(
        TrainerConfig(
            run_dir=str(run), model=ModelConfig(path=model, lora=lora), optim=OptimConfig(lr=5e-2)
        ),
        total_steps=3,
    )
    try:
        initial = trainer.export(RunLayout(run).weights_version(0))
        train_a_little(trainer, steps=3)
        trained = trainer.export(RunLayout(run).weights_version(3))
        assert initial is not None and trained is not None
        assert sorted(p.name for p in trained.glob("adapter_*")) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        moved, full = published_bytes(trained), published_bytes(model)
        print(f"adapter {moved} bytes, model {full} bytes")
        assert moved < full / 5
        prompt = trainer.tokenizer("<|im_start|>user\nreverse abc<|im_end|>\n")["input_ids"]
        async with (
            server.client(adapter="run-a") as client_a,
            server.client(adapter="run-b") as client_b,
        ):
            a, b = AdminClient(client_a), AdminClient(client_b)
            assert await a.load_adapter(str(initial), 0) == 0
            assert await b.load_adapter(str(initial), 0) == 0
            base_gen = await client_a.completion(prompt, "run-a", SAMPLING)
            assert await a.load_adapter(str(trained), 3) == 3  # in place, same name
            gen = await client_a.completion(prompt, "run-a", SAMPLING)
            other = await client_b.completion(prompt, "run-b", SAMPLING)
            assert gen.policy_version_end == 3 and other.policy_version_end == 0
            assert (await a.status())["adapters"] == {"run-a": 3, "run-b": 0}
            ours = trainer_logprobs(trainer, prompt, gen.completion_token_ids)
            fit = close(gen.completion_logprobs, ours, "adapter v3 vs trainer")
            # run-b still serves the initial adapter (= the base): its policy, not run-a's
            base = hf_logprobs(tiny_model_dir, prompt, other.completion_token_ids)
            close(other.completion_logprobs, base, "adapter v0 vs base")
            stale = trainer_logprobs(trainer, prompt, base_gen.completion_token_ids)
            assert (torch.tensor(base_gen.completion_logprobs) - stale).abs().mean() > 5 * fit

            # `rlkit eval` against the served adapter by name (its card completed from the base's)
            out = tmp_path / "eval"
            cmd = [RLKIT, "eval", "reverse-text", "-m", "run-a", "-b", f"{server.url}/v1"]
            cmd += ["--token-file", str(server.token_file)]
            cmd += ["-t", "8", "-n", "2", "-r", "1", "-o", str(out)]
            subprocess.run(cmd, check=True, timeout=300)
            check_engine_results(out, n=2, r=1)

            merged = tmp_path / "merged"
            cmd = [RLKIT, "model", "merge", str(trained), "--out", str(merged)]
            subprocess.run(cmd, check=True, timeout=300)
            close(
                gen.completion_logprobs,
                hf_logprobs(merged, prompt, gen.completion_token_ids),
                "adapter v3 served vs merged in transformers",
            )
            publish_files(merged, version=3)  # published as a version by files
            async with server.client() as plain:
                await AdminClient(plain).update_weights(str(merged), version=3)  # base := merged
                merged_gen = await plain.completion(prompt, model, SAMPLING)
            ours = trainer_logprobs(trainer, prompt, merged_gen.completion_token_ids)
            close(merged_gen.completion_logprobs, ours, "merged in vLLM vs trainer")

            await a.unload_adapter()
            assert (await b.status())["adapters"] == {"run-b": 0}
            with pytest.raises(InferenceError):
                await client_a.completion(prompt, "run-a", SAMPLING)
    finally:
        trainer.close()
        await reset_lora_server(server, tiny_model_dir)  # the next LoRA test's server
