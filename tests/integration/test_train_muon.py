"""`rlkit train --trainer.optim.name muon` on the tiny model: the training reward rises.

The CPU demo config (reverse-text, IcePop) from the untrained tiny Qwen3, without the SFT warm
start tests/integration/test_train.py's AdamW run has, with the sync scheduler (8 groups of 8
on-policy rollouts a step; the demo's C3PO++ drops about half its rollouts as stale at
max_off_policy_steps = 1, which slows learning). Mean training reward (difflib ratio against the
reversed text, sampled at T=1) of the first and last ten of 60 steps, Muon at lr 5e-3, in four
runs: 0.071 -> 0.272, 0.070 -> 0.124, 0.068 -> 0.209, 0.073 -> 0.162. With the demo's C3PO++
and lr 3e-3 the rise was smaller and less reliable (0.069 -> 0.131, 0.113, 0.097, 0.078 in four
runs).

40 steps, not 60: at lr 5e-3 Muon can drive the policy's entropy from 6.9 to under 0.1 by step
50; every group's rewards are then equal and the no-signal watchdog rightly stops the run (one
suite run in session 30: mean reward 0.072 -> 0.158 over steps 31-40, stopped at step 55). Steps
31-40 of that run and of two that finished 60 steps: 0.158, 0.140 and 0.123 against 0.07-0.072;
two runs of this 40-step test: 0.110 and 0.171 against 0.071 and 0.073.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.cli import tiny_train_cmd
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import SHORT, run

pytestmark = pytest.mark.slow

STEPS = 40
# Mean training reward of the last ten logged steps must beat the first ten by this much.
MARGIN = 0.03


def test_train_with_muon_raises_the_reward(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            *urls,
            f"--orchestrator.max_steps={STEPS}",
            "--orchestrator.scheduler=sync",  # on-policy: no rollout dropped as stale
            "--orchestrator.schedulers.sync.batch_groups=8",
            "--trainer.optim.name=muon",
            "--trainer.optim.lr=5e-3",
        )
        assert run(cmd, tmp_path / "run.log") == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert 'name = "muon"' in (run_dir / "config.toml").read_text()
    lines = (run_dir / "trainer_metrics.jsonl").read_text().splitlines()
    trainer = [json.loads(line) for line in lines]
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in trainer)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean/reverse-text-lcs"] for r in records]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + MARGIN, f"reward did not rise: {first:.3f} -> {last:.3f}: {rewards}"
