"""Train-inference mismatch on a tiny MoE with routing replay off, R2 and R3, same rollouts.

One vLLM server serves a tiny Qwen3-MoE (bf16) returning routed experts: on a GPU through
vLLM's own `--enable-return-routed-experts`, on CPU (where vLLM cannot return them) through
rlkit's `--rlkit-capture-routing`, which records the experts vLLM's routers chose, per request
(the same choice `rlkit train` makes for R3). Completions are sampled once, with the engine's
logprobs and routing. The FSDP2 trainer (fp32) then runs one RL step of two mini-steps on
those samples with `routing_replay` = none, r2 and r3 (a fresh trainer each, same seed) and
reports the mismatch metrics between trainer and engine, computed on each mini-step's
forward before its update: the k3 KL estimate (`mismatch_kl`), the extreme-token fraction
F(tau=2) (`mismatch_extreme_frac`) and router disagreement (token-layer pairs whose trainer
top-k differs from the routing known for the sample: the engine's for none and r3, the
pre-update trainer's for r2). `first` is the first mini-step alone (same weights as the
engine, so R2 equals none there by construction); `step` averages both mini-steps (the
second runs after one update).

    python tests/benchmarks/bench_routing_replay.py [--completions 64] [--max-tokens 48]

Prints one JSON line with the three variants side by side and the ratios to none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from rlkit.envs.rollout import decode_routed_experts
from rlkit.inference import ServerProcess, start_server
from rlkit.launch.launcher import routing_server_options
from rlkit.models import init_tiny
from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence
from rlkit.trainer.trainer import Trainer

KEYS = ("mismatch_kl", "mismatch_extreme_frac", "router_disagreement")


async def sample(
    server: ServerProcess, model: str, n: int, max_tokens: int, vocab: int
) -> list[TokenSequence]:
    """`n` completions of random prompts with the engine's logprobs and routing."""
    g = torch.Generator().manual_seed(0)
    async with server.client() as client:
        client.routing = True
        prompts = [torch.randint(3, vocab, (12,), generator=g).tolist() for _ in range(n)]
        sampling = {"max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True}
        gens = await asyncio.gather(
            *(client.completion(p, model, {**sampling, "seed": i}) for i, p in enumerate(prompts))
        )
    seqs = []
    for i, (prompt, gen) in enumerate(zip(prompts, gens, strict=True)):
        ids = prompt + gen.completion_token_ids
        routing = decode_routed_experts(gen.routed_experts)
        pad = np.full((len(ids) - len(routing), *routing.shape[1:]), -1, np.int16)
        seqs.append(
            TokenSequence(
                ids,
                [0] * len(prompt) + [1] * len(gen.completion_token_ids),
                [0.0] * len(prompt) + gen.completion_logprobs,
                advantage=1.0 if i % 2 else -1.0,
                routing=torch.from_numpy(np.concatenate([routing, pad]).astype(np.int64)),
            )
        )
    return seqs


def measure(model: str, run_dir: str, seqs: list[TokenSequence], replay: str) -> dict[str, dict]:
    cfg = TrainerConfig(
        run_dir=run_dir,
        model=ModelConfig(path=model),
        routing_replay=replay,
        loss=LossConfig(name="icepop"),
    )
    cfg.optim.lr = 1e-3
    loss = cfg.loss.resolved
    trainer = Trainer(cfg, total_steps=1)
    try:
        half = len(seqs) // 2
        chunks = [seqs[:half], seqs[half:]]
        norms = [loss.normalizer(c) for c in chunks]
        first, _, _ = trainer.compute_gradients(chunks[0], loss, norms[0])
        trainer.optimizer.zero_grad(set_to_none=True)
        if first.get("router_known_pairs"):
            first["router_disagreement"] = (
                first["router_differ_pairs"] / first["router_known_pairs"]
            )
        step = trainer.train_steps(chunks, loss, norms).metrics
        return {
            "first": {k: first.get(k) for k in KEYS},
            "step": {k: step.get(k) for k in KEYS},
        }
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(init_tiny(Path(tmp) / "moe", arch="qwen3-moe", seed=0))
        flags, env = routing_server_options(True)
        server = start_server(
            model,
            log_path=Path(tmp) / "vllm.log",
            extra_args=[*flags, "--max-model-len", "512"],
            env=env,
        )
        try:
            server.wait_ready(timeout=600)
            vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
            seqs = asyncio.run(sample(server, model, args.completions, args.max_tokens, vocab))
        finally:
            server.stop()
        results = {
            replay: measure(model, str(Path(tmp) / f"run-{replay}"), seqs, replay)
            for replay in ("none", "r2", "r3")
        }

    def ratio(replay: str, phase: str, key: str) -> float | None:
        base, value = results["none"][phase][key], results[replay][phase][key]
        return None if not base or value is None else value / base

    print(
        json.dumps(
            {
                "bench": "routing_replay",
                "model": "tiny qwen3-moe (4 experts, top-2, 2 MoE layers), engine bf16, "
                "trainer fp32",
                "engine_routing": flags[0],
                "completions": args.completions,
                "completion_tokens": sum(sum(s.loss_mask) for s in seqs),
                "results": results,
                "kl_ratio_vs_none": {
                    r: {p: ratio(r, p, "mismatch_kl") for p in ("first", "step")}
                    for r in ("r2", "r3")
                },
                "extreme_ratio_vs_none": {
                    r: {p: ratio(r, p, "mismatch_extreme_frac") for p in ("first", "step")}
                    for r in ("r2", "r3")
                },
            }
        )
    )


if __name__ == "__main__":
    main()
