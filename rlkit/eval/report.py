"""Rich rendering of eval runs: the summary table and sample pages (`rlkit eval show`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rlkit.eval.metrics import summarize
from rlkit.eval.store import EvalResult, EvalRun
from rlkit.progress import print_line
from rlkit.runs.rollout_errors import cause_lines, detail_lines, error_record


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def summary_table(summary: dict[str, Any], title: str = "eval summary") -> Table:
    """Two-column table of everything `summarize` reports."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    k = summary["rollouts_per_example"]
    rows: list[tuple[str, Any]] = [
        ("rollouts", summary["num_rollouts"]),
        ("examples", summary["num_examples"]),
        ("reward mean", summary["reward_mean"]),
        ("reward std", summary["reward_std"]),
        (f"avg@{k}", summary[f"avg@{k}"]),
    ]
    success = summary["pass_metric"] or "reward"
    rows += [
        (f"{name} ({success} >= {summary['pass_threshold']:g})", value)
        for name, value in summary["pass_at_k"].items()
    ]
    rows += [(f"metric {name}", value) for name, value in summary["metrics"].items()]
    rows += [
        (f"reward {field}={value}", mean)
        for field, groups in summary.get("reward_by", {}).items()
        for value, mean in groups.items()
    ]
    rows += [
        ("errors", summary["errors"]),
        (
            "turns sent as",
            ", ".join(f"{mode} {n}" for mode, n in summary.get("prompt_modes", {}).items()),
        ),
        ("prompt tokens", summary["prompt_tokens"]),
        ("completion tokens", summary["completion_tokens"]),
        ("latency p50 (s)", summary["latency_p50_s"]),
        ("latency p95 (s)", summary["latency_p95_s"]),
    ]
    for name, value in rows:
        table.add_row(name, _fmt(value))
    return table


def run_summary(run: EvalRun) -> dict[str, Any]:
    """Summary recomputed from the results on disk (also right for interrupted runs)."""
    config = run.metadata.config
    return summarize(
        run.rollouts,
        run.metadata.rollouts_per_example,
        threshold=config.get("pass_threshold", 1.0),
        metric=config.get("pass_metric"),
    )


def run_header(run: EvalRun) -> Text:
    meta = run.metadata
    version = f"@{meta.env_version}" if meta.env_version else ""
    return Text(
        f"{meta.env_id}{version} | model {meta.model} | {meta.num_examples} examples x "
        f"{meta.rollouts_per_example} rollouts | status {meta.status} | {meta.created_at}\n"
        f"sampling {meta.sampling} | env args {meta.env_args} | {run.run_dir}"
    )


def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = message.get("tool_calls") or []
    return content + "".join(f"\n[tool call] {c.get('function', c)}" for c in calls)


def sample_panel(result: EvalResult) -> Panel:
    """One rollout: prompt, completion, answer, reward, metrics, error."""
    rollout = result.rollout
    parts: list[Any] = []
    for message in rollout.prompt + rollout.completion:
        role = message.get("role", "?")
        parts.append(Text(f"{role}: ", style="bold cyan").append(_content(message), style=""))
    parts.append(Text(f"answer: {rollout.answer}", style="green"))
    metrics = ", ".join(f"{k}={v:.3f}" for k, v in rollout.metrics.items())
    parts.append(Text(f"reward {rollout.reward:.4f}  {metrics}", style="bold"))
    if rollout.error:
        parts.append(Text(f"error: {rollout.error}", style="bold red"))
    title = f"example {result.example_index} rollout {result.rollout_index}"
    return Panel(Group(*parts), title=title, title_align="left")


def error_records(run: EvalRun) -> list[dict[str, Any]]:
    """The run's errored rollouts as `rlkit.runs.rollout_errors` records."""
    return [
        error_record(
            env_id=run.metadata.env_id,
            example_id=r.rollout.example_id,
            error=r.rollout.error,
            phase="eval",
            example=r.example_index,
            rollout=r.rollout_index,
        )
        for r in run.results
        if r.rollout.error is not None
    ]


def error_summary(run: EvalRun) -> list[str]:
    """'errored rollouts 46 of 176: sandbox service unreachable' per cause, and where the full
    messages are; nothing when no rollout errored."""
    records = error_records(run)
    if not records:
        return []
    counts = Counter(r["cause"] for r in records)
    return [f"errored rollouts {line}" for line in cause_lines(counts, len(run.results))] + [
        f"every error in full: rlkit eval show {run.run_dir} --errors"
    ]


def show_run(console: Console, run: EvalRun, samples: int = 5, errors_only: bool = False) -> None:
    """Print the header, the summary, the errors by cause and up to `samples` rollouts (through
    a pager on a TTY); `errors_only`: every errored rollout's full message instead of samples."""
    chosen = [] if errors_only else run.results[:samples]

    def render() -> None:
        console.print(run_header(run))
        console.print(summary_table(run_summary(run)))
        for line in error_summary(run) + (detail_lines(error_records(run)) if errors_only else []):
            print_line(console, line)
        for result in chosen:
            console.print(sample_panel(result))

    if console.is_terminal and (chosen or errors_only):
        with console.pager(styles=True):
            render()
    else:
        render()
