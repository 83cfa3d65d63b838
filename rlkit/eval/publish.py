"""Publishing an eval run's results to the hub, against the environment version evaluated.

It lives in `rlkit.eval` (which may use the hub client) so that the hub never imports the
evaluation code: the layering is envs -> hub, eval -> envs + hub.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.envs.rollout import Rollout
from rlkit.errors import UsageError
from rlkit.eval.metrics import summarize
from rlkit.eval.store import load_run
from rlkit.hub.base import HubError
from rlkit.hub.client import open_hub
from rlkit.hub.local import LocalHub
from rlkit.hub.names import EnvRef, parse_env_id
from rlkit.hub.records import MAX_ROLLOUT_SAMPLE, EvalRecord, ReproductionRecord

SAMPLE_FIELDS = {"example_id", "prompt", "completion", "answer", "reward", "metrics", "error"}


def rollout_sample(rollouts: list[Rollout], size: int = MAX_ROLLOUT_SAMPLE) -> list[dict]:
    """Up to `size` rollouts spread evenly over the run, so readers of the leaderboard can see
    what the model actually answered."""
    step = max(1, len(rollouts) // size)
    return [r.model_dump(mode="json", include=SAMPLE_FIELDS) for r in rollouts[::step][:size]]


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
            "env_id": meta.env_id,
            "env_version": meta.env_version,
            "env_args": meta.env_args,
            "sampling": meta.sampling,
            "rlkit_version": meta.rlkit_version,
            "errors": summary.get("errors", 0),
            "started": meta.created_at,
            "finished": meta.updated_at,
        },
        rollouts=rollout_sample(rollouts),
    )
    return meta.env_id, meta.env_version, record


def push_eval_results(run_dir: Path, hub: str | None = None, reproduces: int | None = None) -> str:
    """Upload a run's summary, metadata and a sample of its rollouts to the hub as a claimed
    result; with `reproduces`, record it instead as a re-run of that result (which verifies the
    result when the hub accepts this caller as the environment's owner or a trusted runner).
    Returns where it can be seen (URL or card path)."""
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
    if reproduces is None:
        target.add_eval(ref, version, record)
    else:
        rerun = ReproductionRecord(
            **record.model_dump(include=set(ReproductionRecord.model_fields))
        )
        target.add_reproduction(ref, version, reproduces, rerun)
    if isinstance(target, LocalHub):
        return str(target.root / "projects" / f"{ref.name}.json")
    return f"{target.location}/envs/{ref.owner}/{ref.name}"
