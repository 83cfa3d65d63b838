"""Orchestrator checkpoints: the step, the prompt sampler (RNG, data position, difficulty pools).

One JSON file per finished step, `run_dir/orchestrator/step_{N:06d}.json`, written atomically.
A resumed run restarts at the trainer's latest checkpoint step S: it loads the orchestrator state
of step S and discards batches, weights and metric lines of later steps, which were produced from
a stream the resumed run will regenerate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rlkit import handoff
from rlkit.atomic import atomic_write
from rlkit.errors import UsageError
from rlkit.orchestrator.metrics import recover_step_records, truncate_jsonl
from rlkit.trainer.checkpoint import resolve_checkpoint


def state_path(run_dir: Path, step: int) -> Path:
    return run_dir / "orchestrator" / f"step_{step:06d}.json"


def save_state(run_dir: Path, step: int, state: dict[str, Any], keep_last: int = 5) -> None:
    path = state_path(run_dir, step)
    atomic_write(path, json.dumps({"step": step, **state}))
    for old in sorted(path.parent.glob("step_*.json"))[:-keep_last]:
        old.unlink()


def trainer_checkpoint_step(run_dir: Path) -> int:
    """Step of the trainer's latest checkpoint (0 when it has none)."""
    ckpt = resolve_checkpoint(run_dir, "latest")
    return int(ckpt.name.removeprefix("step_")) if ckpt is not None else 0


def _step_of(path: Path) -> int:
    return int(path.name.split(".")[0].removeprefix("step_"))


def prepare_resume(run_dir: Path) -> tuple[int, dict[str, Any] | None]:
    """Roll the run directory back to the trainer's checkpoint; returns (step, saved state)."""
    step = trainer_checkpoint_step(run_dir)
    state: dict[str, Any] | None = None
    if step:
        path = state_path(run_dir, step)
        if not path.exists():
            raise UsageError(
                f"cannot resume {run_dir}: the trainer checkpoint is at step {step} but "
                f"{path} is missing"
            )
        state = json.loads(path.read_text())
        weights = run_dir / "weights" / f"step_{step:06d}"
        if not (weights / "STABLE").exists():
            raise UsageError(f"cannot resume {run_dir}: published weights {weights} are missing")
    for folder, suffix in (("batches", ".pt"), ("orchestrator", ".json")):
        for path in (run_dir / folder).glob(f"step_*{suffix}"):
            if _step_of(path) > step:
                path.unlink()
    for path in (run_dir / "weights").glob("step_*"):
        if _step_of(path) > step:
            shutil.rmtree(path)
    handoff.clear_stop(run_dir)
    truncate_jsonl(run_dir / "metrics.jsonl", step)
    truncate_jsonl(run_dir / "trainer_metrics.jsonl", step)
    recover_step_records(run_dir, step)
    return step, state


def check_fresh_run_dir(run_dir: Path) -> None:
    """A new run must not mix with an old one in the same directory."""
    if any((run_dir / name).exists() for name in ("batches", "weights", "metrics.jsonl")):
        raise UsageError(
            f"log.run_dir {run_dir} already holds a run; pass --resume to continue it or "
            "choose another log.run_dir"
        )
