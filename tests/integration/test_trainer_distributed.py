"""Two gloo ranks under torchrun compute the same loss and gradients as one process.

The file is also the probe script: `python THIS OUT MODEL` (one process) or under
`torch.distributed.run --nproc_per_node 2` computes one batch's gradients without stepping and
saves the loss metrics plus the full (unsharded) gradients to OUT from rank 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def synthetic_batch(vocab: int, seed: int = 0) -> list:
    """Seven samples of mixed lengths with prompt (mask 0) and completion (mask 1) tokens."""
    from rlkit.trainer.packing import Sequence

    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i, (prompt, completion) in enumerate(
        [(5, 9), (3, 20), (8, 4), (6, 13), (2, 7), (9, 9), (4, 30)]
    ):
        n = prompt + completion
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * prompt + [1] * completion
        inf = [0.0] * prompt + (-torch.rand(completion, generator=g) * 5).tolist()
        seqs.append(Sequence(ids, mask, inf, advantage=(i % 3) - 1.0 + 0.25))
    return seqs


def probe(out: str, model_dir: str) -> None:
    from rlkit.trainer import dist
    from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
    from rlkit.trainer.engine import Trainer
    from rlkit.trainer.rl import batch_normalizer, make_rl_loss

    cfg = TrainerConfig(
        run_dir=str(Path(out).parent / "run"),
        model=ModelConfig(path=model_dir),
        micro_batch_tokens=40,  # several micro-batches: uneven split across the two ranks
        loss=LossConfig(name="grpo"),
    )
    trainer = Trainer(cfg, total_steps=1)
    seqs = synthetic_batch(trainer.policy.lm.config.vocab_size)
    metrics, nonfinite, n_mbs = trainer.compute_gradients(
        seqs, make_rl_loss(cfg.loss), batch_normalizer(seqs, "token-mean")
    )
    grads = {}
    for name, param in trainer.policy.named_parameters():
        grad = param.grad
        grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).clone()
    if dist.is_main():
        torch.save({"metrics": metrics, "grads": grads, "micro_batches": n_mbs}, out)
    trainer.close()


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_two_ranks_match_one_process(
    arch: str, tiny_model_dir: Path, tiny_moe_model_dir: Path, tmp_path: Path
) -> None:
    """The MoE's experts are 3-D parameters sharded with their decoder layer."""
    model_dir = str(tiny_model_dir if arch == "dense" else tiny_moe_model_dir)
    single, double = tmp_path / "one.pt", tmp_path / "two.pt"
    _run([sys.executable, __file__, str(single), model_dir])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    _run([*torchrun, "--standalone", __file__, str(double), model_dir])
    one, two = torch.load(single), torch.load(double)
    assert one["micro_batches"] == two["micro_batches"] >= 3
    for key in ("loss", "num_tokens", "mismatch_kl"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-6), key
    assert one["grads"].keys() == two["grads"].keys()
    nonzero = 0
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        nonzero += int(grad.abs().sum() > 0)
    assert nonzero == len(one["grads"])


if __name__ == "__main__":
    probe(sys.argv[1], sys.argv[2])
