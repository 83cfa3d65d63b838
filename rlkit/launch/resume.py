"""What `rlkit train --resume` continues, and what an interrupted run tells its user.

A resumed run is the run's saved configuration (`run_dir/config.toml`, written when it started)
plus this command line's overrides, so nothing has to be repeated; the overrides that change
something are named in one line, and whatever the config file given differs in is ignored (and
named). A run that reached `orchestrator.max_steps` leaves `COMPLETE`; resuming it starts nothing
unless max_steps is raised. An interrupted run prints one line: its newest checkpoint and the
exact command that continues it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from rlkit.atomic import atomic_write
from rlkit.config import load_config
from rlkit.launch.config import RLJobConfig
from rlkit.protocol.layout import RunLayout, step_of


def resume_command(run_dir: str | Path) -> str:
    """The command that continues the run in `run_dir` with its saved configuration."""
    return f"rlkit train {shlex.quote(str(RunLayout(run_dir).config))} --resume"


def resumed_config(config_path: str | Path, overrides: list[str]) -> tuple[RLJobConfig, list[str]]:
    """The config a `--resume` runs with, and the lines that say what differs from the saved run
    (none for a run with no saved config yet: it starts from `config_path`)."""
    given = load_config(RLJobConfig, config_path, overrides)
    saved_path = RunLayout(given.log.run_dir).config
    if not saved_path.is_file():
        return given, []
    saved = load_config(RLJobConfig, saved_path)
    resumed = load_config(RLJobConfig, saved_path, overrides)
    lines = []
    changed = _differences(saved, resumed)
    if changed:
        lines.append("resume: changed from the saved run: " + _describe(changed))
    ignored = _differences(resumed, given)
    if ignored and Path(config_path).resolve() != saved_path.resolve():
        lines.append(
            f"resume: the run's saved {saved_path} is used; {config_path} differs in "
            f"{', '.join(sorted(ignored))} (ignored: pass an override to change one)"
        )
    return resumed, lines


def mark_complete(run_dir: str | Path, step: int) -> None:
    """Record that the run trained to its last step."""
    atomic_write(RunLayout(run_dir).complete, json.dumps({"step": step}))


def clear_complete(run_dir: str | Path) -> None:
    RunLayout(run_dir).complete.unlink(missing_ok=True)


def record_resume(run_dir: str | Path, step: int) -> None:
    """Note that the run continued from `step` (a marker on the report's plots)."""
    with open(RunLayout(run_dir).resumes, "a") as f:
        f.write(json.dumps({"step": step}) + "\n")


def finished_line(cfg: RLJobConfig) -> str | None:
    """For a run already trained to `cfg`'s max_steps: the line that says so; else None."""
    path = RunLayout(cfg.log.run_dir).complete
    if not path.is_file():
        return None
    step = int(json.loads(path.read_text())["step"])
    if cfg.orchestrator.max_steps and cfg.orchestrator.max_steps > step:
        return None
    return (
        f"run {cfg.log.run_dir} already finished at step {step} (orchestrator.max_steps "
        f"{cfg.orchestrator.max_steps}); nothing to do. To train further: "
        f"{resume_command(cfg.log.run_dir)} --orchestrator.max_steps {step * 2}"
    )


def interrupted_line(run_dir: str | Path) -> str:
    """One line for an interrupted run: its newest checkpoint and how to continue."""
    layout = RunLayout(run_dir)
    checkpoint = layout.latest_checkpoint()
    command = resume_command(run_dir)
    if not layout.config.is_file():
        return "interrupted before the run started: nothing to resume"
    if checkpoint is None:
        return f"interrupted before the first checkpoint; start it again with: {command}"
    return (
        f"interrupted: newest checkpoint {checkpoint} (step {step_of(checkpoint)}); "
        f"continue with: {command}"
    )


def _differences(before: RLJobConfig, after: RLJobConfig) -> dict[str, tuple[Any, Any]]:
    old, new = _flat(before.model_dump(mode="json")), _flat(after.model_dump(mode="json"))
    return {
        key: (old.get(key), new.get(key))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    }


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): data}


def _describe(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())
