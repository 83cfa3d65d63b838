"""Per-step metrics: `metrics.jsonl` (`rlkit.protocol.layout`), one console line, the `[log]`
sinks (TensorBoard, W&B, MLflow: `rlkit.orchestrator.loggers`) and the PNG plot.

The orchestrator's own numbers (rewards, phase times, idle fraction, staleness, purges) are
merged with the trainer's record for the same step from `trainer_metrics.jsonl` (mismatch KL,
F(tau), IcePop masked fractions, gradient norm, learning rate).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from rlkit.atomic import atomic_path, atomic_write
from rlkit.orchestrator.batching import GroupStats
from rlkit.orchestrator.loggers import Sink, append_samples, eval_scalars, scalars
from rlkit.orchestrator.scheduler import Counters
from rlkit.progress import print_line
from rlkit.protocol.batch import TrainBatch, read_batch
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.panels import PLOT_PANELS
from rlkit.runs.rollout_errors import cause_key

PLOT_COLUMNS = 3  # metrics.png: panels per row


def _pstdev(values: list[float]) -> float:
    """Population std in floats: `statistics.pstdev` computes it exactly in fractions, ~8x
    slower, which a simulated run of 1,000 rollouts a step pays every step."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def _frac(count: int, total: int) -> float | None:
    return count / total if total else None


def step_record(
    step: int,
    batch: TrainBatch,
    stats: GroupStats,
    counters: Counters,
    *,
    rollout_time_s: float,
    train_time_s: float,
    step_time_s: float,
    idle_s: float,
    weights_wait_s: float,
    weight_update_s: float,
) -> dict[str, Any]:
    """The orchestrator's side of one step's metrics.

    `train_time_s` (batch written to weights live) = `weights_wait_s` (until the trainer
    publishes) + `weight_update_s` (the servers loading them).
    """
    record: dict[str, Any] = {"step": step}
    all_rewards = [r for rs in stats.rewards.values() for r in rs]
    record["reward_mean"] = statistics.fmean(all_rewards) if all_rewards else None
    for env_id, rewards in sorted(stats.rewards.items()):
        record[f"reward_mean/{env_id}"] = statistics.fmean(rewards)
        record[f"reward_std/{env_id}"] = _pstdev(rewards)
        record[f"solve_rate/{env_id}"] = statistics.fmean(stats.solved[env_id])
    for env_task, rewards in sorted(stats.task_rewards.items()):
        record[f"reward_mean/{env_task}"] = statistics.fmean(rewards)
    for env_function, scores in sorted(stats.reward_functions.items()):
        record[f"reward_fn_mean/{env_function}"] = statistics.fmean(scores)
    record["exploit_flagged"] = sum(
        count for name, count in stats.flagged.items() if not name.endswith("!error")
    )
    for env_exploit, count in sorted(stats.flagged.items()):
        record[f"exploit_flagged/{env_exploit}"] = count
    lengths = stats.completion_lengths
    staleness = batch.meta["staleness"]
    record.update(
        batch_samples=len(batch.samples),
        batch_tokens=batch.meta["tokens"],
        rollout_time_s=rollout_time_s,
        train_time_s=train_time_s,
        weights_wait_s=weights_wait_s,
        weight_update_s=weight_update_s,
        step_time_s=step_time_s,
        inference_idle_frac=min(1.0, idle_s / step_time_s) if step_time_s > 0 else 0.0,
        tokens_per_s=sum(lengths) / step_time_s if step_time_s > 0 else 0.0,
        completion_len_mean=statistics.fmean(lengths) if lengths else None,
        completion_len_max=max(lengths, default=None),
        staleness_mean=statistics.fmean(staleness) if staleness else 0.0,
        staleness_max=max(staleness, default=0),
        rollouts_launched=counters.launched,
        rollouts_finished=counters.finished,
        rollouts_purged=counters.purged,
        rollouts_stale=counters.stale,
        rollouts_errored=stats.errored,
        rollouts_context=stats.context_ended,
        exact_continuation_frac=_frac(stats.exact_continuations, stats.rollouts),
        token_prompt_frac=_frac(stats.token_prompts, stats.rollouts),
        turns_per_rollout=_frac(stats.turns, stats.rollouts),
        zero_advantage_groups=stats.zero_advantage_groups,
    )
    for lag, count in sorted(Counter(staleness).items()):
        record[f"staleness_hist/{lag}"] = count
    causes = Counter(r["cause"] for r in stats.error_records)
    for cause, count in causes.most_common():  # a number for every logger, the text in the JSONL
        record[f"rollouts_errored/{cause_key(cause)}"] = count
    if causes:
        record["errors_by_cause"] = dict(causes.most_common())
    return record


def read_trainer_record(run_dir: Path, step: int) -> dict[str, Any] | None:
    """The trainer's metrics line for `step`, if written yet."""
    path = RunLayout(run_dir).trainer_metrics
    if not path.exists():
        return None
    for line in reversed(path.read_text().splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("step") == step:
            return record
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep records up to `max_step` (a resumed run rewrites what came after its checkpoint)."""
    if not path.exists():
        return
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))


def recover_step_records(run_dir: Path, last_step: int) -> list[int]:
    """Append the records of trained steps <= `last_step` that metrics.jsonl lacks; return them.

    A run interrupted after the trainer checkpointed step N but before the orchestrator logged
    N (it logs once the servers load N's weights) resumes at N + 1, so N's line would be lost.
    It is rebuilt from N's batch and the trainer's line, marked `recovered`; the orchestrator's
    timings and counters of that step are gone and left out.
    """
    layout = RunLayout(run_dir)
    logged = {r["step"] for r in read_jsonl(layout.metrics)}
    recovered = []
    for step in range(1, last_step + 1):
        trainer = read_trainer_record(run_dir, step)
        if step in logged or trainer is None or not layout.batch(step).exists():
            continue
        batch = read_batch(layout.batch(step))
        rewards: dict[str, list[float]] = {}
        for sample in batch.samples:
            rewards.setdefault(sample.env_id, []).append(sample.reward)
        ours: dict[str, Any] = {"step": step, "recovered": True}
        every = [r for rs in rewards.values() for r in rs]
        ours["reward_mean"] = statistics.fmean(every) if every else None
        for env_id, values in sorted(rewards.items()):
            ours[f"reward_mean/{env_id}"] = statistics.fmean(values)
        ours.update(batch_samples=len(batch.samples), batch_tokens=batch.meta.get("tokens"))
        recovered.append({**ours, **{k: v for k, v in trainer.items() if k not in ours}})
    if recovered:
        records = sorted(read_jsonl(layout.metrics) + recovered, key=lambda r: r["step"])
        atomic_write(layout.metrics, "".join(json.dumps(r) + "\n" for r in records))
    return [r["step"] for r in recovered]


def write_plot(records: list[dict[str, Any]], out: Path) -> None:
    """Every `PLOT_PANELS` curve across steps, as one PNG (atomic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = -(-len(PLOT_PANELS) // PLOT_COLUMNS)
    fig, axes = plt.subplots(rows, PLOT_COLUMNS, figsize=(4.5 * PLOT_COLUMNS, 3.2 * rows))
    for ax in axes.flat[len(PLOT_PANELS) :]:
        ax.set_visible(False)
    for ax, (title, keys) in zip(axes.flat, PLOT_PANELS, strict=False):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1 and ax.get_lines():
            ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(out, durable=False) as tmp:
        fig.savefig(tmp, dpi=90, format=out.suffix.removeprefix(".") or "png")
    plt.close(fig)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def step_line(r: dict[str, Any]) -> str:
    """The step's console line (one line: logs are grepped by it)."""
    masked = None
    if r.get("icepop_masked_low_frac") is not None:
        masked = r["icepop_masked_low_frac"] + r.get("icepop_masked_high_frac", 0.0)
    router = r.get("router_disagreement")
    return (
        f"step {r['step']:>4} | reward {_fmt(r.get('reward_mean'), '.3f')} | "
        f"kl {_fmt(r.get('mismatch_kl'), '.2e')} | masked {_fmt(masked, '.3f')} | "
        f"wait rollouts {r['rollout_time_s']:.1f}s train {r['train_time_s']:.1f}s | "
        f"idle {r['inference_idle_frac']:.2f} | {r['tokens_per_s']:.0f} tok/s | "
        f"stale {r['staleness_mean']:.2f} | turns {_fmt(r.get('turns_per_rollout'), '.1f')} "
        f"exact {_fmt(r.get('exact_continuation_frac'), '.2f')} | "
        f"purged {r['rollouts_purged']} | errored {r['rollouts_errored']}"
        + (f" | router disagree {router:.3f}" if router is not None else "")
    )


class MetricsLogger:
    """Appends step records to metrics.jsonl, prints a line, redraws the plot, feeds the sinks.

    The plot is drawn after the first step, then at most every `plot_every_s`; call
    `draw_plot()` at the end of a run for the final curves. Sample rollouts given to `log` are
    kept every `samples_every` steps (samples.jsonl and each sink).
    """

    def __init__(
        self,
        run_dir: Path,
        console: Console,
        *,
        plot: bool,
        plot_every_s: float = 0.0,
        sinks: list[Sink] | None = None,
        samples_every: int = 0,
    ) -> None:
        layout = RunLayout(run_dir)
        self.path = layout.metrics
        self.plot_path = layout.metrics_plot
        self.samples_path = layout.samples
        self.console = console
        self.plot = plot
        self.plot_every_s = plot_every_s
        self._plotted_at: float | None = None  # monotonic time of the last draw
        self._unplotted = False
        self.sinks = sinks or []
        self.samples_every = samples_every

    def draw_plot(self) -> None:
        """Redraw metrics.png now if any step was logged since the last draw."""
        if self.plot and self._unplotted:
            write_plot(read_jsonl(self.path), self.plot_path)
            self._plotted_at = time.monotonic()
            self._unplotted = False

    def log(self, record: dict[str, Any], samples: list[dict[str, Any]] | None = None) -> None:
        step = record["step"]
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        print_line(self.console, step_line(record))
        self._unplotted = True
        due = self._plotted_at is None or time.monotonic() - self._plotted_at >= self.plot_every_s
        if due:  # drawing blocks the event loop (and a core): rate-limited, see LogConfig
            self.draw_plot()
        numbers = scalars(record)
        for sink in self.sinks:
            sink.log(numbers, step)
        if samples and self.samples_due(step):
            append_samples(self.samples_path, samples)
            for sink in self.sinks:
                sink.log_samples(samples, step)

    def log_eval(self, step: int, summaries: dict[str, dict[str, Any]]) -> None:
        """An interleaved eval's points to every sink (eval.jsonl holds the records)."""
        numbers = eval_scalars(summaries)
        for sink in self.sinks:
            sink.log(numbers, step)

    def samples_due(self, step: int) -> bool:
        """Whether step `step` logs sample rollouts (every `samples_every` steps; 0 = never)."""
        return bool(self.samples_every) and step % self.samples_every == 0

    def close(self) -> None:
        """Finish every sink's run (W&B, MLflow) and close its files."""
        for sink in self.sinks:
            sink.close()
