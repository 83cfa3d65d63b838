"""`rlkit train --trainer.optim.name muon` on the tiny model: the training reward rises.

The CPU demo config (reverse-text, IcePop, C3PO++) from the untrained tiny Qwen3, without the
SFT warm start tests/integration/test_train.py's AdamW run has. Muon at lr 3e-3 lifts the
training reward (difflib ratio against the reversed text, sampled at T=1) within 60 steps; in
two runs the mean of the first ten logged steps was 0.069 and 0.068, of the last ten 0.131 and
0.113 (lr 5e-3: 0.069 -> 0.120; lr 1e-2 is unstable: 0.069 -> 0.083).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.cli import tiny_train_cmd
from tests.integration.test_train_liveness import SHORT, run

pytestmark = pytest.mark.slow

STEPS = 60
# Mean training reward of the last ten logged steps must beat the first ten by this much.
MARGIN = 0.02


def test_train_with_muon_raises_the_reward(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={STEPS}",
        "--trainer.optim.name=muon",
        "--trainer.optim.lr=3e-3",
    )
    assert run(cmd, tmp_path / "run.log") == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert 'name = "muon"' in (run_dir / "config.toml").read_text()
    lines = (run_dir / "trainer_metrics.jsonl").read_text().splitlines()
    trainer = [json.loads(line) for line in lines]
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in trainer)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # a step during which no rollout finished (its batch waited in the pool) logs no reward
    rewards = [r["reward_mean/reverse-text"] for r in records if "reward_mean/reverse-text" in r]
    assert len(rewards) >= 30, rewards
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + MARGIN, f"reward did not rise: {first:.3f} -> {last:.3f}: {rewards}"
