"""Trainer step throughput (tokens/s) for RL and SFT, tiny and small models, packed vs padded.

    python tests/benchmarks/bench_train_throughput.py [--steps 2] [--samples 16]

Builds the models locally, runs every variant in this one process on the same synthetic batch
(lengths spread like real rollouts: short prompts, long-tailed completions) and prints one JSON
line with the best tokens/s per variant and the packed/padded ratio per (model, mode).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from rlkit.models import init_tiny
from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence
from rlkit.trainer.sft import sft_loss
from rlkit.trainer.trainer import Trainer

MICRO_BATCH_TOKENS = 2048


def synthetic_batch(vocab: int, samples: int, seed: int = 0) -> list[TokenSequence]:
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(samples):
        prompt = int(torch.randint(16, 64, (1,), generator=g))
        completion = int(min(448, 24 + torch.empty(1).exponential_(1 / 140, generator=g).item()))
        n = prompt + completion
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        inf = [0.0] * prompt + (-torch.rand(completion, generator=g) * 3 - 4).tolist()
        seqs.append(TokenSequence(ids, [0] * prompt + [1] * completion, inf, (i % 2) - 0.5))
    return seqs


def measure(
    trainer: Trainer, seqs: list[TokenSequence], mode: str, steps: int
) -> dict[bool, float]:
    """Best tokens/s of packed and padded over `steps` interleaved steps (after a warm-up each).

    Interleaving and best-of keep other processes' load on a shared machine from favouring
    whichever variant happened to run in a quiet moment.
    """
    icepop = LossConfig(name="icepop").resolved
    loss = icepop if mode == "rl" else sft_loss
    normalizer = icepop.normalizer(seqs)
    best = {True: 0.0, False: 0.0}
    for i in range(steps + 1):
        for packing in (True, False):
            trainer.cfg.packing = packing
            rate = trainer.train_step(seqs, loss, normalizer).metrics["tokens_per_s"]
            if i:
                best[packing] = max(best[packing], rate)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in ("tiny", "small"):
            model = init_tiny(Path(tmp) / size, size=size)
            cfg = TrainerConfig(
                run_dir=str(Path(tmp) / "run"),
                model=ModelConfig(path=str(model)),
                micro_batch_tokens=MICRO_BATCH_TOKENS,
                optim={"lr": 1e-6},
            )
            trainer = Trainer(cfg, total_steps=100)
            seqs = synthetic_batch(trainer.policy.lm.config.vocab_size, args.samples)
            results[f"{size}_batch_tokens"] = float(sum(len(s.token_ids) for s in seqs))
            for mode in ("rl", "sft"):
                best = measure(trainer, seqs, mode, args.steps)
                results[f"{size}_{mode}_packed_tok_s"] = round(best[True], 1)
                results[f"{size}_{mode}_padded_tok_s"] = round(best[False], 1)
                ratio = (
                    results[f"{size}_{mode}_packed_tok_s"] / results[f"{size}_{mode}_padded_tok_s"]
                )
                results[f"{size}_{mode}_packed_over_padded"] = round(ratio, 3)
            trainer.close()
    results.update(
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        threads=torch.get_num_threads(),
        samples=args.samples,
        steps=args.steps,
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
