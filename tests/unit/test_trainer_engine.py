"""Optimiser schedule and activation checkpointing (same loss and gradients, less memory)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from rlkit.trainer.config import LossConfig, ModelConfig, OptimConfig, TrainerConfig
from rlkit.trainer.dist import whole
from rlkit.trainer.optim import lr_factor
from rlkit.trainer.packing import TokenSequence
from rlkit.trainer.trainer import Trainer
from tests.helpers.tolerance import forward_terms, summation_atol


def test_warmup_then_cosine_and_constant() -> None:
    cos = OptimConfig(warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(s, cos, 14) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(9, cos, 14) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_factor(14, cos, 14) == pytest.approx(0.1)
    const = OptimConfig(warmup_steps=2)
    assert [lr_factor(s, const, 10) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]


def gradients(model_dir: Path, tmp_path: Path, checkpointing: bool) -> tuple[float, dict]:
    cfg = TrainerConfig(
        run_dir=str(tmp_path),
        model=ModelConfig(path=str(model_dir), activation_checkpointing=checkpointing),
        micro_batch_tokens=64,
        loss=LossConfig(name="grpo"),
    )
    trainer = Trainer(cfg, total_steps=1)
    assert trainer.policy.lm.is_gradient_checkpointing == checkpointing
    try:
        g = torch.Generator().manual_seed(1)
        seqs = [
            TokenSequence(
                torch.randint(0, 1000, (n,), generator=g).tolist(),
                [0] * 4 + [1] * (n - 4),
                [-1.0] * n,
                advantage=a,
            )
            for n, a in ((20, 1.0), (33, -0.5), (12, 0.25))
        ]
        metrics, _, _ = trainer.compute_gradients(
            seqs, cfg.loss.resolved, cfg.loss.resolved.normalizer(seqs)
        )
        grads = {n: whole(p.grad).clone() for n, p in trainer.policy.named_parameters()}
        return metrics["loss"], grads
    finally:
        trainer.close()


def test_activation_checkpointing_gives_the_same_gradients(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    loss, grads = gradients(tiny_model_dir, tmp_path, checkpointing=False)
    loss_ac, grads_ac = gradients(tiny_model_dir, tmp_path, checkpointing=True)
    assert loss_ac == pytest.approx(loss, rel=1e-6)
    # the recomputed forward may sum in another order; a weight's gradient also sums the
    # 65 tokens' contributions (sequences of 20, 33 and 12)
    terms = forward_terms(AutoConfig.from_pretrained(tiny_model_dir), keys=33) + 65
    for name, grad in grads.items():
        atol = summation_atol(terms, float(grad.abs().max()))
        torch.testing.assert_close(grads_ac[name], grad, rtol=0, atol=atol, msg=name)


def test_bad_loss_config_fails_before_any_work(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from rlkit.trainer.main import main

    with pytest.raises(ValidationError, match=r"params\.alpah: unknown field; did you mean alpha"):
        LossConfig(name="icepop", params={"alpah": 0.3})
    with pytest.raises(ValidationError, match="unknown loss 'ppo'"):
        LossConfig(name="ppo")
    assert LossConfig(name="gspo").resolved.params.agg == "seq-mean-token-mean"
    config = tmp_path / "rl.toml"
    config.write_text('[loss]\nname = "icepop"\n[optim]\nlr = -1.0\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--loss.params.alpah=1"])
    assert exit_info.value.code == 2
    assert not (tmp_path / "runs").exists()
