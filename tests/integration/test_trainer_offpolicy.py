"""The loss family as the trainer calls it, on a batch whose samples come from an older policy.

The batch's inference logprobs are the tiny model's at initialisation; the trainer starts from
that model after a few high-lr SFT steps, so every sample is stale. Gradients are read at each
optimiser mini-step (a spy on `_optimizer_step`), from identical starting weights per loss.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from rlkit.protocol.layout import RunLayout
from rlkit.trainer.config import LossConfig, ModelConfig, OptimConfig, TrainerConfig
from rlkit.trainer.dist import whole
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.rl import split_mini_batches
from rlkit.trainer.sft import sft_loss
from rlkit.trainer.trainer import StepResult, Trainer

# trainers on the tiny model, a dozen optimiser steps per loss: about 25 s
pytestmark = pytest.mark.slow

LOSSES = ["grpo", "cispo", "gspo", "gppo", "icepop"]
PROMPT, COMPLETION = 6, 18


def random_sequences(n: int = 8) -> list[TokenSequence]:
    g = torch.Generator().manual_seed(0)
    return [
        TokenSequence(
            torch.randint(0, 1000, (PROMPT + COMPLETION,), generator=g).tolist(),
            [0] * PROMPT + [1] * COMPLETION,
            [0.0] * (PROMPT + COMPLETION),
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(n)
    ]


def policy_logprobs(trainer: Trainer, seqs: list[TokenSequence]) -> list[list[float]]:
    """Per-token logprobs (0.0 on prompt tokens) in the batch-file layout."""
    out = []
    for seq in seqs:
        (mb,) = make_micro_batches([seq], 4096)
        with torch.no_grad():
            lp, _ = trainer.logprobs(mb)
        out.append([0.0] + lp[0].tolist())
    return out


@pytest.fixture(scope="module")
def stale_setup(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model dir of the newer policy, sequences carrying the older policy's logprobs)."""
    root = tmp_path_factory.mktemp("offpolicy")
    trainer = Trainer(
        TrainerConfig(
            run_dir=str(root),
            model=ModelConfig(path=str(tiny_model_dir)),
            optim=OptimConfig(lr=3e-3),
        ),
        total_steps=3,
    )
    try:
        seqs = random_sequences()
        behaviour = policy_logprobs(trainer, seqs)
        for _ in range(3):  # move the policy: SFT on the batch's own completions
            assert not trainer.train_step(seqs, sft_loss, normalizer=8 * COMPLETION).skipped
        newer = trainer.export(RunLayout(root).weights_version(3))
    finally:
        trainer.close()
    for seq, lps in zip(seqs, behaviour, strict=True):
        seq.inference_logprobs = lps
    return newer, seqs


def make_trainer(model: Path, run_dir: Path, loss: LossConfig) -> Trainer:
    cfg = TrainerConfig(
        run_dir=str(run_dir),
        model=ModelConfig(path=str(model)),
        optim=OptimConfig(lr=2e-2, max_grad_norm=1e9),
        loss=loss,
    )
    return Trainer(cfg, total_steps=1)


def spy_gradients(trainer: Trainer) -> list[torch.Tensor]:
    """Record the flat full gradient at every optimiser mini-step."""
    grads: list[torch.Tensor] = []
    step = trainer._optimizer_step

    def recording(nonfinite: bool) -> tuple[float, bool]:
        grads.append(torch.cat([whole(p.grad).flatten() for p in trainer.params]).clone())
        return step(nonfinite)

    trainer._optimizer_step = recording  # type: ignore[method-assign]
    return grads


def run_step(
    model: Path, run_dir: Path, seqs: list[TokenSequence], loss: LossConfig, mini_batches: int
) -> tuple[StepResult, list[torch.Tensor]]:
    trainer = make_trainer(model, run_dir, loss)
    try:
        grads = spy_gradients(trainer)
        chunks = split_mini_batches(seqs, mini_batches)
        result = trainer.train_steps(
            chunks,
            loss.resolved,
            [loss.resolved.normalizer(c) for c in chunks],
            loss.resolved.recomputes_old,
        )
        return result, grads
    finally:
        trainer.close()


def assert_pairwise_different(grads: dict[str, torch.Tensor]) -> None:
    for a, b in itertools.combinations(grads, 2):
        rel = (grads[a] - grads[b]).norm() / grads[a].norm()
        assert rel > 1e-3, f"{a} and {b} give the same gradient (relative difference {rel:.2e})"


def test_recomputed_prox_with_mini_batches_clips_and_separates_losses(
    stale_setup: tuple, tmp_path: Path
) -> None:
    model, seqs = stale_setup
    second: dict[str, torch.Tensor] = {}
    clips: dict[str, float] = {}
    for name in [*LOSSES, "grpo-none"]:
        loss = LossConfig(
            name=name.split("-")[0],
            # cispo's default has no lower bound; here the update mostly lowers ratios
            params={"eps_low": 0.2} if name == "cispo" else {},
            old_policy="recomputed",
            mismatch_correction="none" if name.endswith("none") else "icepop",
        )
        result, grads = run_step(model, tmp_path / name, seqs, loss, mini_batches=2)
        m = result.metrics
        assert len(grads) == 2 and m["mini_steps"] == 2
        clipped = m["clip_frac_low"] + m["clip_frac_high"]
        print(f"{name}: clip_frac {clipped:.3f} mismatch_kl {m['mismatch_kl']:.3f}")
        clips[name] = clipped
        assert m["mismatch_kl"] > 0.01  # pi_old is measured against the stale engine logprobs
        second[name] = grads[1]  # after one update, r = pi_theta / pi_old != 1
    assert all(clips.values()), f"a loss clipped no token over two mini-steps: {clips}"
    # icepop is GRPO with the icepop correction (both are the default); every other pair differs.
    torch.testing.assert_close(second.pop("icepop"), second["grpo"])
    assert_pairwise_different(second)


def test_without_recompute_every_loss_differs(stale_setup: tuple, tmp_path: Path) -> None:
    """grpo/cispo/gspo/gppo take pi_inf as old policy; icepop the single-step form."""
    model, seqs = stale_setup
    first: dict[str, torch.Tensor] = {}
    for name in LOSSES:
        result, grads = run_step(model, tmp_path / name, seqs, LossConfig(name=name), 2)
        m = result.metrics
        if name != "icepop":  # r = pi_theta / pi_inf is far from 1 on stale samples
            assert m["clip_frac_low"] + m["clip_frac_high"] > 0, name
        first[name] = grads[0]
    assert_pairwise_different(first)


@pytest.mark.parametrize("name", LOSSES + ["tis"])
def test_tokens_outside_the_icepop_band_get_no_gradient(
    stale_setup: tuple, tmp_path: Path, name: str
) -> None:
    """pi_old / pi_inf = 0.1 (< alpha) on half the sequences: they add nothing."""
    model, seqs = stale_setup
    loss = LossConfig(name=name, old_policy="recomputed")
    trainer = make_trainer(model, tmp_path, loss)
    try:
        prox = policy_logprobs(trainer, seqs)
        mixed = []
        for i, (seq, lps) in enumerate(zip(seqs, prox, strict=True)):
            shift = 2.302585 if i < 4 else 0.0  # k = exp(-shift): 0.1 or 1
            inf = [0.0] * PROMPT + [lp + shift for lp in lps[PROMPT:]]
            mixed.append(TokenSequence(seq.token_ids, seq.loss_mask, inf, seq.advantage))
        loss_fn = loss.resolved
        norm = 100.0

        def grads_of(batch: list[TokenSequence]) -> torch.Tensor:
            metrics, _, _ = trainer.compute_gradients(batch, loss_fn, norm, recompute_old=True)
            flat = torch.cat([whole(p.grad).flatten() for p in trainer.params]).clone()
            trainer.optimizer.zero_grad(set_to_none=True)
            return flat, metrics

        with_masked, metrics = grads_of(mixed)
        in_band_only, _ = grads_of(mixed[4:])
        masked_only, _ = grads_of(mixed[:4])
    finally:
        trainer.close()
    if name == "tis":  # tis has its own correction: a weight of 0.1, not a mask
        assert masked_only.abs().max() > 0
        return
    assert metrics["icepop_masked_low_frac"] == pytest.approx(0.5)
    assert masked_only.abs().max() == 0
    assert in_band_only.abs().max() > 0
    torch.testing.assert_close(with_masked, in_band_only)
