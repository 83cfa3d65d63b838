"""Publishing an eval run's results to the hub, against the environment version evaluated.

It lives in `rlkit.eval` (which may use the hub client) so that the hub never imports the
evaluation code: the layering is envs -> hub, eval -> envs + hub.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.errors import UsageError
from rlkit.eval.metrics import summarize
from rlkit.eval.store import load_run
from rlkit.hub.base import HubError
from rlkit.hub.client import open_hub
from rlkit.hub.local import LocalHub
from rlkit.hub.names import EnvRef, parse_env_id
from rlkit.hub.records import EvalRecord


def run_record(run_dir: Path) -> tuple[str, str | None, EvalRecord]:
    """(env id, env version, leaderboard record) of a finished eval run directory."""
    run = load_run(run_dir)
    meta = run.metadata
    if meta.status != "complete":
        raise UsageError(f"{run_dir}: run is {meta.status}; only complete runs can be pushed")
    rollouts = run.rollouts
    if not rollouts:
        raise UsageError(f"{run_dir}: the run has no results")
    summary = meta.summary or summarize(rollouts, k=meta.rollouts_per_example)
    record = EvalRecord(
        model=meta.model,
        mean_reward=float(summary["reward_mean"]),
        pass_at_k={k: float(v) for k, v in summary.get("pass_at_k", {}).items()},
        n=int(summary.get("num_rollouts", len(rollouts))),
        num_examples=meta.num_examples,
        rollouts_per_example=meta.rollouts_per_example,
        date=meta.created_at,
        metadata={
            "sampling": meta.sampling,
            "env_args": meta.env_args,
            "rlkit_version": meta.rlkit_version,
            "errors": summary.get("errors", 0),
        },
    )
    return meta.env_id, meta.env_version, record


def push_eval_results(run_dir: Path, hub: str | None = None) -> str:
    """Upload a run's summary to the hub; returns where it can be seen (URL or card path)."""
    env_id, env_version, record = run_record(Path(run_dir))
    target = open_hub(hub)
    ref = parse_env_id(env_id, require_owner=False)
    if not ref.owner:  # a bare name: find its owner on the hub
        owners = [s.owner for s in target.search(ref.name) if s.name == ref.name]
        if not owners:
            raise HubError(f"environment {ref.name} is not on hub {target.location}", 404)
        ref = EnvRef(owners[0], ref.name, ref.version)
    version = env_version or ref.version
    if not version:
        raise UsageError(f"{run_dir}: metadata.json records no environment version")
    target.add_eval(ref, version, record)
    if isinstance(target, LocalHub):
        return str(target.root / "projects" / f"{ref.name}.json")
    return f"{target.location}/envs/{ref.owner}/{ref.name}"
