"""Run a test file's own `__main__` on N gloo ranks under torchrun, as the trainer's launcher
starts its ranks, one OpenMP thread each and no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlkit.trainer.main import TrainerRanks


def run_on_ranks(script: str, ranks: int, *args: str, timeout: float = 300) -> None:
    """Run `script` (a test's `__file__`) with `args` on `ranks` processes; fails the test with
    the ranks' stderr when they do not all succeed."""
    root = str(Path(__file__).resolve().parents[2])  # the script imports tests.helpers too
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    cmd = [sys.executable, *TrainerRanks(nproc=ranks).torchrun_args(), str(Path(script)), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
