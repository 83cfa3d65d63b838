"""`rlkit train --trainer.optim.name muon`: a short RL run on the tiny model with the Muon optimiser
completes its steps with finite loss and gradient norms. A rising reward is not asserted: two
steps on CPU are too few to show one (tests/integration/test_train.py asserts it for AdamW)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.cli import tiny_train_cmd
from tests.helpers.train_runs import SHORT, run

pytestmark = pytest.mark.slow


def test_train_with_muon_completes(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(tiny_model_dir, run_dir, *SHORT, "--trainer.optim.name=muon")
    assert run(cmd, tmp_path / "run.log") == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert 'name = "muon"' in (run_dir / "config.toml").read_text()
    lines = (run_dir / "trainer_metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)
