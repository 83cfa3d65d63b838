"""Orchestrator checkpoints: the step, the prompt sampler (RNG, data position, difficulty pools)
and the prompts handed out but not yet trained (`rlkit.orchestrator.prompts`).

One JSON file per finished step, `orchestrator/step_N.json` (`rlkit.protocol.layout`), written
atomically before the step's batch is handed to the trainer (so a trainer checkpoint at step N
always has its state). Kept: every step with a trainer checkpoint and every step since the
latest one (a later checkpoint may land on it); the rest are pruned as the trainer checkpoints.
A resumed run restarts at the trainer's latest checkpoint step S: it loads the orchestrator state
of step S and discards batches, weights and metric lines of later steps, which were produced from
a stream the resumed run will regenerate: the prompts owed at S first, in draw order, then the
sampler's stream from where it stood at S.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.atomic import atomic_write
from rlkit.errors import UsageError
from rlkit.orchestrator.metrics import recover_step_records, truncate_jsonl
from rlkit.protocol import handoff
from rlkit.protocol.batch import read_batch_header
from rlkit.protocol.layout import RunLayout, step_of
from rlkit.runs.rollout_errors import ERRORS_FILE


def save_state(run_dir: Path, step: int, state: dict[str, Any]) -> None:
    """Write step `step`'s state; prune those no checkpoint can need any more."""
    layout = RunLayout(run_dir)
    atomic_write(layout.orchestrator_state(step), json.dumps({"step": step, **state}))
    latest = trainer_checkpoint_step(run_dir)
    for old in layout.orchestrator_state_files():
        kept = step_of(old)
        if kept < latest and not layout.checkpoint(kept).is_dir():
            old.unlink(missing_ok=True)


def trainer_checkpoint_step(run_dir: Path) -> int:
    """Step of the trainer's latest checkpoint (0 when it has none)."""
    ckpt = RunLayout(run_dir).latest_checkpoint()
    return step_of(ckpt) if ckpt is not None else 0


def _batch_prompts(path: Path) -> int:
    meta = read_batch_header(path).meta
    return len(meta.get("prompts", meta.get("group_uids", [])))


def rollback_line(run_dir: Path, step: int, state: dict[str, Any] | None) -> str:
    """One line: what a resume to `step` discards and what the resumed run regenerates."""
    later = [p for p in RunLayout(run_dir).batch_files() if step_of(p) > step]
    where = f"step {step}'s checkpoint" if step else "the start (no trainer checkpoint yet)"
    if later:
        steps = f"{step_of(later[0])}-{step_of(later[-1])}"
        prompts = sum(_batch_prompts(p) for p in later)
        what = f"discarding steps {steps} ({len(later)} batches, {prompts} prompts)"
    else:
        what = "no later batch to discard"
    stream = (state or {}).get("prompts", {})
    owed = [p["draw"] for p in stream.get("owed", [])]
    first = f"{len(owed)} prompts handed out but untrained at step {step}"
    if owed:
        first += f" (draws {owed[0]}..{owed[-1]})" if len(owed) > 1 else f" (draw {owed[0]})"
    return (
        f"resume: rolled back to {where}, {what}; regenerating from step {step + 1}: {first}, "
        f"then the prompt stream from draw {stream.get('next_draw', 0)}"
    )


def prepare_resume(
    run_dir: Path, report: Callable[[str], None] | None = None
) -> tuple[int, dict[str, Any] | None]:
    """Roll the run directory back to the trainer's checkpoint; returns (step, saved state).
    `report` gets the one-line summary (`rollback_line`) before anything is removed."""
    layout = RunLayout(run_dir)
    step = trainer_checkpoint_step(run_dir)
    state: dict[str, Any] | None = None
    if step:
        path = layout.orchestrator_state(step)
        if not path.exists():
            raise UsageError(
                f"cannot resume {run_dir}: the trainer checkpoint is at step {step} but "
                f"{path} is missing"
            )
        state = json.loads(path.read_text())
        weights = layout.weights_version(step)
        if not handoff.is_published(weights):
            raise UsageError(f"cannot resume {run_dir}: published weights {weights} are missing")
    if report is not None:
        report(rollback_line(run_dir, step, state))
    for path in [*layout.batch_files(), *layout.orchestrator_state_files()]:
        if step_of(path) > step:
            path.unlink()
    for path in layout.weights_versions():
        if step_of(path) > step:
            shutil.rmtree(path)
    handoff.clear_stop(run_dir)
    truncate_jsonl(layout.metrics, step)
    truncate_jsonl(layout.trainer_metrics, step)
    truncate_jsonl(Path(run_dir) / ERRORS_FILE, step)
    recover_step_records(run_dir, step)
    return step, state


def check_fresh_run_dir(run_dir: Path) -> None:
    """A new run must not mix with an old one in the same directory."""
    layout = RunLayout(run_dir)
    if any(path.exists() for path in (layout.batches, layout.weights, layout.metrics)):
        raise UsageError(
            f"log.run_dir {run_dir} already holds a run; pass --resume to continue it or "
            "choose another log.run_dir"
        )
