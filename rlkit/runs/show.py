"""`rlkit runs show RUN_DIR`: what a training run did, from the files it left.

Read-only over the run directory (`rlkit.protocol.layout`): `metrics.jsonl` (one record per
step), `eval.jsonl` (the interleaved evaluations), `samples.jsonl` (sample rollouts),
`checkpoints/step_N`, `weights/step_N`, `config.toml`, and the `STOP` / `TRAINER_FAILED` notes
of a run that stopped itself. `summary_lines` is the terminal summary (reward as a sparkline,
eval reward and its strict measure before and after, warnings when the training reward rose
without the strict measure); `write_html` writes one self-contained page (inline SVG plots, no
scripts, no external files) to open or attach anywhere.
"""

from __future__ import annotations

import html
import json
import statistics
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.atomic import atomic_write
from rlkit.errors import UsageError
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.panels import PLOT_PANELS
from rlkit.runs.rollout_errors import ERRORS_FILE, cause_lines, error_cause

SPARKS = "▁▂▃▄▅▆▇█"
Z95 = 1.96  # eval error bars: a 95% interval of the mean over the eval's examples
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written by a live run
            continue
    return records


@dataclass
class RunView:
    """Everything `runs show` reports about one run directory."""

    run_dir: Path
    config: dict[str, Any]
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    checkpoints: list[Path]
    weights: list[Path]
    stopped: str | None = None
    notes: list[str] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)  # steps a `--resume` continued from
    errors: list[dict[str, Any]] = field(default_factory=list)  # errors.jsonl: every errored one

    def series(self, key: str) -> list[tuple[int, float]]:
        return [
            (r["step"], float(r[key]))
            for r in self.steps
            if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
        ]

    def mean(self, key: str) -> float | None:
        values = [v for _, v in self.series(key)]
        return statistics.fmean(values) if values else None

    def max(self, key: str) -> float | None:
        return max((v for _, v in self.series(key)), default=None)

    def eval_points(self) -> list[tuple[str, int, float, float]]:
        """(env_id, step, reward mean, 95% half-width) of every evaluation; the width treats
        the examples as the independent units (rollouts of one example are correlated)."""
        points = []
        for record in self.evals:
            mean, std = record.get("reward_mean"), record.get("reward_std")
            if mean is None:
                continue
            n = max(int(record.get("num_examples") or 1), 1)
            points.append((record.get("env_id", "?"), record["step"], mean, ci95(std, n)))
        return points

    def env_ids(self) -> list[str]:
        """The run's environments: the configured ones, then any other an eval names."""
        ids = [e.get("id", "?") for e in self.config.get("env", [])]
        return ids + sorted({r.get("env_id", "?") for r in self.evals} - set(ids))

    def eval_before_after(self) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """env_id -> (first evaluation, last evaluation)."""
        by_env: dict[str, list[dict[str, Any]]] = {}
        for record in self.evals:
            by_env.setdefault(record.get("env_id", "?"), []).append(record)
        return {
            env: (min(rs, key=lambda r: r["step"]), max(rs, key=lambda r: r["step"]))
            for env, rs in by_env.items()
        }


def load_run(run_dir: str | Path) -> RunView:
    """Read a training run directory; a UsageError when it is not one."""
    root = Path(run_dir)
    layout = RunLayout(root)
    if not root.is_dir():
        raise UsageError(f"{root}: no such run directory")
    if not layout.metrics.exists() and not layout.config.exists():
        raise UsageError(
            f"{root} is not a training run directory (no metrics.jsonl or config.toml): "
            "pass the log.run_dir of an `rlkit train` run"
        )
    config: dict[str, Any] = {}
    if layout.config.exists():
        config = tomllib.loads(layout.config.read_text())
    stopped = None
    for note in (layout.stop, layout.trainer_failed):
        if note.exists():
            stopped = note.read_text().strip()
    return RunView(
        run_dir=root,
        config=config,
        steps=sorted(_jsonl(layout.metrics), key=lambda r: r.get("step", 0)),
        evals=_jsonl(layout.evals),
        samples=_jsonl(layout.samples),
        checkpoints=layout.checkpoint_dirs(),
        weights=layout.weights_versions(),
        stopped=stopped,
        resumes=[int(r["step"]) for r in _jsonl(layout.resumes)],
        errors=_jsonl(root / ERRORS_FILE),
    )


REWARD_RISE = 0.05  # a training reward rise worth a look (in reward units)


def strict_measure(record: dict[str, Any]) -> tuple[str, float] | None:
    """An evaluation's strict measure: the environment's `exact_match` metric when it has one,
    else pass@1 (the share of rollouts at the pass threshold, i.e. solved)."""
    metrics = record.get("metrics") or {}
    if isinstance(metrics.get("exact_match"), int | float):
        return "exact match", float(metrics["exact_match"])
    value = (record.get("pass_at_k") or {}).get("pass@1")
    return ("solved (pass@1)", float(value)) if isinstance(value, int | float) else None


def proportion_ci95(p: float, n: int) -> float:
    """Half-width of a normal 95% interval of a proportion `p` over `n` units."""
    return Z95 * (max(p * (1 - p), 0.0) / max(n, 1)) ** 0.5


def reward_without_task(run: RunView) -> list[str]:
    """Warnings that the training reward rose while a strict held-out measure did not (the
    reward may pay for something other than the task), and the exploit detectors' flags."""
    warnings = []
    rewards = [v for _, v in run.series("reward_mean")]
    if len(rewards) >= 2:
        tenth = max(len(rewards) // 10, 1)
        rise = statistics.fmean(rewards[-tenth:]) - statistics.fmean(rewards[:tenth])
        for env, (first, final) in sorted(run.eval_before_after().items()):
            before, after = strict_measure(first), strict_measure(final)
            if rise <= REWARD_RISE or before is None or after is None or first is final:
                continue
            n = max(int(final.get("num_rollouts") or final.get("num_examples") or 1), 1)
            noise = (proportion_ci95(before[1], n) ** 2 + proportion_ci95(after[1], n) ** 2) ** 0.5
            if after[1] - before[1] <= noise:
                warnings.append(
                    f"WARNING {env}: the training reward rose by {rise:.3f} but held-out "
                    f"{after[0]} did not ({before[1]:.3f} -> {after[1]:.3f}, a rise needs > "
                    f"{noise:.3f}): the reward may pay for something other than the task; "
                    f"`rlkit env audit {env}` plays the cheap answers that earn it"
                )
    flagged = {
        k.removeprefix("exploit_flagged/"): int(sum(v for _, v in run.series(k)))
        for k in sorted({k for r in run.steps for k in r if k.startswith("exploit_flagged/")})
    }
    flagged = {k: v for k, v in flagged.items() if v and not k.endswith("!error")}
    if flagged:
        listed = ", ".join(f"{k} {v}" for k, v in flagged.items())
        warnings.append(
            f"WARNING solved rollouts that look like known exploits (env/exploit count): {listed}"
        )
    return warnings


def error_lines(run: RunView) -> list[str]:
    """Errored rollouts grouped by cause, per phase: 'training: 46 of 176: sandbox service
    unreachable' (the full messages: `rlkit runs show RUN_DIR --errors`)."""
    lines = []
    finished = sum(int(v) for _, v in run.series("rollouts_finished"))
    evaluated = sum(int(r.get("num_rollouts") or 0) for r in run.evals)
    for phase, total in (("train", finished), ("eval", evaluated)):
        causes = Counter(
            r.get("cause") or error_cause(r.get("error")) for r in run.errors if r["phase"] == phase
        )
        label = "training" if phase == "train" else "eval"
        lines += [f"errored {label} rollouts {line}" for line in cause_lines(causes, total)]
    if run.errors:
        lines.append(f"every error in full: rlkit runs show {run.run_dir} --errors")
    return lines


def ci95(std: float | None, n: int) -> float:
    """Half-width of a normal 95% interval of a mean of `n` units with deviation `std`."""
    return Z95 * (std or 0.0) / n**0.5


def sparkline(values: list[float], width: int = 60) -> str:
    """Values as block characters, averaged into at most `width` buckets."""
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [
            statistics.fmean(values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)])
            for i in range(width)
        ]
    low, high = min(values), max(values)
    span = high - low
    return "".join(SPARKS[int((v - low) / span * (len(SPARKS) - 1)) if span else 0] for v in values)


def _num(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def summary_lines(run: RunView) -> list[str]:
    """The terminal summary: one fact per line, plain text."""
    model = run.config.get("model", {}).get("path", "?")
    envs = ", ".join(e.get("id", "?") for e in run.config.get("env", [])) or "?"
    planned = run.config.get("orchestrator", {}).get("max_steps")
    last = run.steps[-1]["step"] if run.steps else 0
    lines = [
        f"run {run.run_dir}",
        f"model {model} on {envs}",
        f"steps {last}" + (f" of {planned}" if planned else ""),
    ]
    rewards = [v for _, v in run.series("reward_mean")]
    if rewards:
        lines.append(
            f"reward {rewards[0]:.3f} -> {rewards[-1]:.3f} (min {min(rewards):.3f}, "
            f"max {max(rewards):.3f})  {sparkline(rewards)}"
        )
    for env in run.env_ids() if len(run.env_ids()) > 1 else []:
        values = [v for _, v in run.series(f"reward_mean/{env}")]
        if values:
            lines.append(f"reward {env}: {values[0]:.3f} -> {values[-1]:.3f}  {sparkline(values)}")
    for env, (first, final) in sorted(run.eval_before_after().items()):
        note = (
            f"; ± is a 95% interval over its {final.get('num_examples')} examples"
            if final.get("reward_std") is not None
            else ""
        )
        lines.append(
            f"eval {env}: reward {_eval_num(first)} (step {first['step']}) -> "
            f"{_eval_num(final)} (step {final['step']}){note}"
        )
        before, after = strict_measure(first), strict_measure(final)
        if before is not None and after is not None:
            lines.append(
                f"eval {env}: {after[0]} {_strict_num(first, before[1])} -> "
                f"{_strict_num(final, after[1])}"
            )
    lines.append(
        f"throughput {_num(run.mean('tokens_per_s'), '.0f')} completion tok/s, "
        f"inference idle {_num(run.mean('inference_idle_frac'), '.2f')}; "
        f"completion length mean {_num(run.mean('completion_len_mean'), '.1f')}, "
        f"max {_num(run.max('completion_len_max'), '.0f')} tokens"
    )
    lines.append(
        f"step {_num(run.mean('step_time_s'), '.1f')}s on average: waited "
        f"{_num(run.mean('rollout_time_s'), '.1f')}s for the batch's rollouts (0 when they were "
        f"generated while the previous step trained), {_num(run.mean('train_time_s'), '.1f')}s "
        "for the trainer and the weight update"
    )
    functions = sorted({k for r in run.steps for k in r if k.startswith("reward_fn_mean/")})
    if functions:
        means = ", ".join(
            f"{k.removeprefix('reward_fn_mean/')} {_num(run.mean(k))}" for k in functions
        )
        lines.append(f"reward functions (mean over the run): {means}")
    kl = run.series("mismatch_kl")
    if kl:
        lines.append(
            f"mismatch KL mean {_num(run.mean('mismatch_kl'), '.2e')}, "
            f"last {kl[-1][1]:.2e}; masked low {_num(run.mean('icepop_masked_low_frac'))} "
            f"high {_num(run.mean('icepop_masked_high_frac'))}"
        )
    errored = sum(int(v) for _, v in run.series("rollouts_errored"))
    finished = sum(int(v) for _, v in run.series("rollouts_finished"))
    purged = sum(int(v) for _, v in run.series("rollouts_purged"))
    lines.append(
        f"rollouts {finished} finished, {errored} errored (scored 0), {purged} purged "
        "(dropped unused: too far off-policy to train on)"
    )
    lines.extend(error_lines(run))
    lines.extend(reward_without_task(run))
    if run.stopped:
        lines.append(f"stopped: {run.stopped}")
    lines.append(
        "checkpoints " + (", ".join(str(p) for p in run.checkpoints) if run.checkpoints else "none")
    )
    if run.weights:
        lines.append(f"latest weights {run.weights[-1]}")
    return lines


def _strict_num(record: dict[str, Any], value: float) -> str:
    n = max(int(record.get("num_rollouts") or record.get("num_examples") or 1), 1)
    return f"{value:.3f} ± {proportion_ci95(value, n):.3f}"


def _strict_cell(record: dict[str, Any]) -> str:
    """The HTML table's strict-measure cell: 'exact match 0.300 ± 0.056' (or '-')."""
    measure = strict_measure(record)
    return (
        "-" if measure is None else html.escape(f"{measure[0]} {_strict_num(record, measure[1])}")
    )


def _eval_num(record: dict[str, Any]) -> str:
    mean = record.get("reward_mean")
    if mean is None or record.get("reward_std") is None:
        return _num(mean)
    width = ci95(record.get("reward_std"), max(int(record.get("num_examples") or 1), 1))
    return f"{mean:.3f} ± {width:.3f}"


def _svg(run: RunView, title: str, keys: tuple[str, ...], w: int = 460, h: int = 240) -> str:
    """One line plot as inline SVG: axes with three labelled ticks each, a polyline per key,
    the evaluations (with 95% error bars) on the reward plot, resumed steps as dashed lines,
    and a legend below the axes."""
    left, right, top, bottom = 66, 10, 28, 48
    envs = run.env_ids() if "reward_mean" in keys else []
    if len(envs) > 1:  # each environment's training reward beside the mean over all
        keys = (*keys, *(f"reward_mean/{env}" for env in envs))
    series = [(key, run.series(key)) for key in keys]
    evals = run.eval_points() if "reward_mean" in keys else []
    env_color = {  # an environment's eval points take its training curve's colour
        env: COLORS[(keys.index(f"reward_mean/{env}") if len(envs) > 1 else i) % len(COLORS)]
        for i, env in enumerate(envs)
    }
    entries = len(keys) + len({env for env, *_ in evals}) + bool(run.resumes)
    stacked = entries > 3  # the legend one entry per line, the plot taller to hold it
    if stacked:
        h += 13 * (entries - 1)
        bottom += 13 * (entries - 1)
    points = [p for _, s in series for p in s]
    points += [(step, m + d) for _, step, m, d in evals] + [
        (step, m - d) for _, step, m, d in evals
    ]
    parts = [
        f'<svg class="plot" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'xmlns="http://www.w3.org/2000/svg" role="img">',
        f'<text x="{w / 2}" y="16" text-anchor="middle" class="title">{html.escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" '
        'class="frame"/>',
    ]
    if not points:
        parts.append(f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if y0 == y1:  # a constant (a learning rate of 1e-6): an axis of its own scale around it
        pad = abs(y0) * 0.1 or 0.5
        y0, y1 = y0 - pad, y1 + pad

    def xy(step: float, value: float) -> str:
        x = left + (step - x0) / ((x1 - x0) or 1) * (w - left - right)
        y = top + (1 - (value - y0) / (y1 - y0)) * (h - top - bottom)
        return f"{x:.1f},{y:.1f}"

    for frac in (0.0, 0.5, 1.0):  # three ticks per axis, labelled
        value, step = y0 + frac * (y1 - y0), x0 + frac * (x1 - x0)
        y = float(xy(x0, value).split(",")[1])
        x = float(xy(step, y0).split(",")[0])
        anchor = ("start", "middle", "end")[int(frac * 2)]
        parts += [
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{value:.3g}</text>',
            f'<text x="{x:.1f}" y="{h - bottom + 14}" text-anchor="{anchor}">{step:.0f}</text>',
        ]
    parts.append(
        f'<text x="{left + (w - left - right) / 2}" y="{h - bottom + 27}" '
        'text-anchor="middle">step</text>'
    )
    for step in run.resumes:
        if x0 <= step <= x1:
            x = xy(step, y0).split(",")[0]
            parts.append(
                f'<line x1="{x}" y1="{top}" x2="{x}" y2="{h - bottom}" class="resume">'
                f"<title>resumed from step {step}</title></line>"
            )
    legend = []
    for i, (key, s) in enumerate(series):
        if not s:
            continue
        color = COLORS[i % len(COLORS)]
        path = " ".join(xy(step, value) for step, value in s)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        if len(s) == 1:
            cx, cy = xy(*s[0]).split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
        env = key.removeprefix("reward_mean/")
        legend.append((f"training reward {env}" if env in env_color else key, color))
    for env, step, mean, width in evals:
        cx, cy = xy(step, mean).split(",")
        _, hi = xy(step, mean + width).split(",")
        _, lo = xy(step, mean - width).split(",")
        paint = f'style="stroke:{env_color.get(env, "#000")};fill:{env_color.get(env, "#000")}"'
        label = html.escape(f"eval {env} at step {step}: {mean:.3f} ± {width:.3f}")
        parts.append(
            f'<g class="eval" data-env="{html.escape(env)}"><title>{label}</title>'
            f'<line x1="{cx}" y1="{hi}" x2="{cx}" y2="{lo}" class="eval" {paint}/>'
            f'<rect x="{float(cx) - 3:.1f}" y="{float(cy) - 3:.1f}" width="6" height="6" '
            f'class="eval" {paint}/></g>'
        )
    for env in dict.fromkeys(env for env, *_ in evals):
        legend.append((f"eval {env} (95% interval)", env_color.get(env, "#000")))
    if run.resumes:
        legend.append(("resumed", "#888"))
    x, y = left, h - 6 - (13 * (len(legend) - 1) if stacked else 0)
    for label, color in legend:  # below the axes: never over the curves, never cut off
        parts.append(f'<text x="{x}" y="{y}" fill="{color}">■ {html.escape(label)}</text>')
        x, y = (x, y + 13) if stacked else (x + 18 + 7 * len(label), y)
    parts.append("</svg>")
    return "".join(parts)


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 24px; }
.summary { background: #f5f5f7; padding: 12px; border-radius: 6px; font-size: 13px;
  white-space: pre-wrap; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plot { border: 1px solid #ddd; border-radius: 6px; background: #fff; font-size: 11px; }
.plot .title { font-size: 13px; font-weight: 600; }
.plot .frame { fill: none; stroke: #bbb; }
.plot .eval { stroke: #000; fill: #000; stroke-width: 1.5; }
.plot .resume { stroke: #888; stroke-dasharray: 4 3; }
table { border-collapse: collapse; font-size: 12px; }
td, th { border: 1px solid #ddd; padding: 4px 8px; vertical-align: top; text-align: left; }
td.text { white-space: pre-wrap; max-width: 480px; font-family: monospace; }
"""


def render_html(run: RunView) -> str:
    """The report as one HTML document (no scripts, no external resources)."""
    esc = html.escape
    plots = "".join(_svg(run, title, keys) for title, keys in PLOT_PANELS)
    evals = "".join(
        f"<tr><td>{esc(env)}</td><td>{first['step']}</td><td>{_eval_num(first)}</td>"
        f"<td>{_strict_cell(first)}</td><td>{final['step']}</td><td>{_eval_num(final)}</td>"
        f"<td>{_strict_cell(final)}</td></tr>"
        for env, (first, final) in sorted(run.eval_before_after().items())
    )
    samples = "".join(
        f"<tr><td>{s.get('step')}</td><td>{esc(str(s.get('env_id')))}</td>"
        f'<td class="text">{esc(str(s.get("prompt")))}</td>'
        f'<td class="text">{esc(str(s.get("completion")))}</td>'
        f"<td>{_num(s.get('reward'))}</td></tr>"
        for s in run.samples[-20:]
    )
    sections = [
        f"<h1>rlkit run {esc(str(run.run_dir))}</h1>",
        f'<div class="summary" id="summary">{esc(chr(10).join(summary_lines(run)))}</div>',
        f'<h2>Curves</h2><div class="plots" id="plots">{plots}</div>',
    ]
    if evals:
        sections.append(
            '<h2>Evaluation</h2><table id="evals"><tr><th>environment</th><th>first step</th>'
            "<th>reward</th><th>strict measure</th><th>last step</th><th>reward</th>"
            f"<th>strict measure</th></tr>{evals}</table>"
        )
    if samples:
        sections.append(
            '<h2>Sample rollouts</h2><table id="samples"><tr><th>step</th><th>environment</th>'
            f"<th>prompt</th><th>completion</th><th>reward</th></tr>{samples}</table>"
        )
    sections.append(f'<p id="note">{esc(per_env_note(run))}</p>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>rlkit run {esc(run.run_dir.name)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(sections)}</body></html>\n"
    )


def per_env_note(run: RunView) -> str:
    """The report's closing note: what it shows of each environment."""
    parts = []
    for env in run.env_ids():
        values = [v for _, v in run.series(f"reward_mean/{env}")]
        points = [p for p in run.eval_points() if p[0] == env]
        shown = [s for s in run.samples[-20:] if s.get("env_id") == env]
        train = (
            f"training reward {values[0]:.3f} -> {values[-1]:.3f} over {len(values)} steps"
            if values
            else "no scored training rollouts"
        )
        parts.append(
            f"{env}: {train}; {len(points)} eval points (95% intervals over the eval's "
            f"examples); {len(shown)} of the sample rollouts"
        )
    curves = (
        " Each environment has its own curve and colour on the reward plot."
        if len(parts) > 1
        else ""
    )
    return "Per environment: " + "; ".join(parts) + "." + curves


def write_html(run: RunView, path: str | Path) -> Path:
    """Write the report atomically to `path`."""
    return atomic_write(Path(path), render_html(run), durable=False)
