"""Every shipped example config and every documented `[loss]` field that validates also starts.

A config that validates must not die later (`loss.params.kl_coef = 0.1` once passed --dry-run and
then failed on the trainer's first micro-batch). Each example config is dry-run as its command
would run it and its printed config loads back; each documented loss field is dry-run with a
non-default value and then trained on for one micro-batch.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import get_args

import pytest
import torch

from rlkit.config import load_config
from rlkit.launch.config import RLJobConfig
from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
from rlkit.trainer.loss import LOSSES, Correction
from rlkit.trainer.packing import TokenSequence
from rlkit.trainer.rl_loss import OldPolicy
from rlkit.trainer.trainer import Trainer
from tests.helpers.cli import ROOT


def rlkit(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> str:
    """Run `rlkit ARGS` in-process; returns its stdout (stderr shown on failure)."""
    from rlkit_cli.main import main

    monkeypatch.setattr(sys, "argv", ["rlkit", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    assert exit_info.value.code in (0, None), err
    return out


EXAMPLES = sorted((ROOT / "examples").rglob("*.toml"))
# their datasets are fetched from a hub by name: only the trainer's part can be checked here
HUB_DATA = {"multi-node/two-node.toml", "multi-node/eight-node.toml"}
BUILT_IN_LOSSES = ["icepop", "grpo", "tis", "cispo", "gspo", "gppo"]
# one valid non-default value for every parameter a built-in loss documents
PARAM_VALUES = {
    "agg": "seq-mean-token-mean",
    "alpha": 0.4,
    "beta": 4.0,
    "tis_cap": 3.0,
    "seq_reject_below": 1e-3,
    "extreme_tau": 3.0,
    "kl_coef": 0.1,
    "sft_on_correct": True,
    "sft_coef": 0.2,
    "eps_low": 0.1,
    "eps_high": 0.3,
    "clip_c": 3.0,
}


def loss_variants() -> dict[str, LossConfig]:
    """Every built-in loss, old policy, mismatch correction and parameter, each changed once."""
    variants = {name: LossConfig(name=name) for name in BUILT_IN_LOSSES}
    for policy in get_args(OldPolicy):
        variants[f"old_policy={policy}"] = LossConfig(name="grpo", old_policy=policy)
    for correction in get_args(Correction):
        variants[f"correction={correction}"] = LossConfig(
            name="grpo", mismatch_correction=correction
        )
    for field, value in PARAM_VALUES.items():
        variants[f"params.{field}"] = LossConfig(name="grpo", params={field: value})
    return variants


def test_every_documented_loss_field_is_exercised() -> None:
    """A new loss parameter or loss must be added to this test's tables."""
    documented = set()
    for name in BUILT_IN_LOSSES:
        documented |= set(LOSSES.get(name).params.model_fields)
    assert documented == set(PARAM_VALUES)
    assert set(BUILT_IN_LOSSES) <= set(LOSSES.names())


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_example_config_dry_runs_and_loads_back(
    example: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "environments" / "reverse-text"))
    data = tomllib.loads(example.read_text())
    command = "train" if "env" in data else "sft"
    role = ["--role", "trainer"] if str(example.relative_to(ROOT / "examples")) in HUB_DATA else []
    out = rlkit(monkeypatch, capsys, command, str(example), "--dry-run", *role)
    if command == "train":  # the resolved config is a config: it loads back unchanged
        printed = tmp_path / "resolved.toml"
        printed.write_text(out)
        assert load_config(RLJobConfig, printed) == load_config(RLJobConfig, example)


@pytest.mark.parametrize("variant", list(loss_variants()))
def test_loss_field_dry_runs(
    variant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    loss = loss_variants()[variant]
    flags = [f"--loss.name={loss.name}", f"--loss.old_policy={loss.old_policy}"]
    flags += [f"--loss.params.{k}={str(v).lower()}" for k, v in loss.params.items()]
    if "mismatch_correction" in loss.model_fields_set:
        flags.append(f"--loss.mismatch_correction={loss.mismatch_correction}")
    example = str(ROOT / "examples" / "tiny-cpu" / "train.toml")
    out = rlkit(monkeypatch, capsys, "train", example, "--dry-run", "--role", "trainer", *flags)
    assert f'old_policy = "{loss.old_policy}"' in out


@pytest.mark.slow  # builds a trainer with its reference model and runs every loss (~12 s)
def test_every_loss_field_trains_one_micro_batch(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One trainer, built for kl_coef > 0 (so with its reference model), runs one micro-batch of
    every variant's resolved loss."""
    variants = loss_variants()
    cfg = TrainerConfig(
        run_dir=str(tmp_path),
        model=ModelConfig(path=str(tiny_model_dir)),
        loss=variants["params.kl_coef"],
    )
    trainer = Trainer(cfg, total_steps=1)
    try:
        assert trainer.reference is not None
        g = torch.Generator().manual_seed(0)
        seqs = [
            TokenSequence(
                torch.randint(0, 200, (n,), generator=g).tolist(),
                [0] * 4 + [1] * (n - 4),
                [-1.0] * n,
                advantage=a,
                temperature=0.7,
            )
            for n, a in ((12, 1.0), (9, -0.5))
        ]
        for name, loss in variants.items():
            resolved = loss.resolved
            metrics, nonfinite, micro_batches = trainer.compute_gradients(
                seqs, resolved, resolved.normalizer(seqs), resolved.recomputes_old
            )
            assert micro_batches == 1 and not nonfinite, name
            assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), name
            trainer.optimizer.zero_grad(set_to_none=True)
        # the reference is the initial policy, frozen: KL 0 before a step, > 0 after one
        kl = variants["params.kl_coef"].resolved
        before = trainer.train_step(seqs, kl, kl.normalizer(seqs)).metrics["ref_kl"]
        after, _, _ = trainer.compute_gradients(seqs, kl, kl.normalizer(seqs))
        assert before == pytest.approx(0.0, abs=1e-6) and after["ref_kl"] > 1e-6
    finally:
        trainer.close()
