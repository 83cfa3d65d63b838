"""Interleaved evaluation on held-out rows with the training servers.

Uses each environment's eval split (`get_eval_dataset`), the first `examples` rows,
`rollouts_per_example` rollouts each, the eval sampling overrides, and `rlkit.eval.summarize`
for the numbers. Results go to `run_dir/eval.jsonl` (one summary per environment and step) and
the rollouts to `run_dir/eval/step_N.jsonl`, so a run's before/after can be inspected.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from rlkit.envs.sampling import SamplingConfig, resolve_sampling
from rlkit.eval.metrics import summarize
from rlkit.inference.pool import ClientPool
from rlkit.orchestrator.config import OnlineEvalConfig
from rlkit.progress import print_line
from rlkit.protocol.layout import RunLayout
from rlkit.runs.rollout_errors import append_errors, cause_lines, error_record


async def evaluate(
    envs: dict[str, Any],
    pool: ClientPool,
    model: str,
    sampling: SamplingConfig,
    cfg: OnlineEvalConfig,
    *,
    step: int,
    run_dir: Path,
    solve_threshold: float,
    console: Console,
) -> dict[str, dict[str, Any]]:
    """Evaluate every environment; returns {env_id: summary}."""
    eval_sampling = resolve_sampling(sampling, cfg.sampling)
    summaries: dict[str, dict[str, Any]] = {}
    layout = RunLayout(run_dir)
    layout.eval_rollouts(step).parent.mkdir(parents=True, exist_ok=True)
    for env_id, env in envs.items():
        rows = env.get_eval_dataset(cfg.examples)
        groups = await asyncio.gather(
            *(
                env.run_group(row, pool.next(), model, eval_sampling, cfg.rollouts_per_example)
                for row in rows
            )
        )
        rollouts = [r for group in groups for r in group]
        summary = summarize(rollouts, cfg.rollouts_per_example, threshold=solve_threshold)
        summaries[env_id] = summary
        with open(layout.eval_rollouts(step), "a") as f:
            for rollout in rollouts:
                f.write(json.dumps(rollout.model_dump(mode="json")) + "\n")
        errored = [r for r in rollouts if r.error]
        with open(layout.evals, "a") as f:
            f.write(json.dumps({"step": step, "env_id": env_id, **summary}) + "\n")
        append_errors(
            run_dir,
            [
                error_record(
                    env_id=env_id, example_id=r.example_id, error=r.error, phase="eval", step=step
                )
                for r in errored
            ],
        )
        causes = Counter(summary["errors_by_cause"])
        why = "".join(f"; {line}" for line in cause_lines(causes, len(rollouts)))
        print_line(
            console,
            f"eval step {step} {env_id}: reward {summary['reward_mean']:.3f} "
            f"(n={summary['num_rollouts']}, errors={len(errored)}{why})",
        )
    return summaries
