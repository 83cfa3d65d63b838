"""`rlkit simulate`'s defaults from the config it is given, not the simulator's own.

A `[simulate]` field the user set (in the TOML or on the command line) always wins. Otherwise:

- servers: `inference.num_servers`;
- sequences per server: `--max-num-seqs` in `inference.extra_args`;
- trainer step time (`train_base_s`, `train_per_token_s`) and weight-update pause (`update_s`):
  fitted to the `metrics.jsonl` of a previous run of the same config (the `log.run_dir` it
  sets), or of the run directory given as `simulate.trace`: `train_time_s` against
  `batch_tokens` by least squares with non-negative terms; `weight_update_s`'s median.

Each default says where it came from (`Implied.lines`), so a figure the config does not imply
(the simulator's own default) is visible as such.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.sim.config import SimConfig

MIN_STEPS = 3  # metrics rows needed to fit a step time


@dataclass
class Implied:
    sim: SimConfig
    sources: dict[str, str] = field(default_factory=dict)  # field -> where its value came from

    def lines(self, servers: int, servers_from: str | None = None) -> list[str]:
        """One line per figure: its value and where it came from."""
        s = self.sim
        sources = {**self.sources, **({"servers": servers_from} if servers_from else {})}
        shown = {
            "servers": f"servers {servers}",
            "max_seqs": f"sequences per server {s.max_seqs}",
            "train_base_s": (
                f"trainer step {s.train_base_s:.3g} s + {s.train_per_token_s:.3g} s/token"
            ),
            "update_s": f"weight update {s.update_s:.3g} s",
        }
        default = "the simulator's default (set [simulate] {})"
        return [f"  {text}: {sources.get(n, default.format(n))}" for n, text in shown.items()]


def _max_num_seqs(extra_args: list[str]) -> int | None:
    """The last `--max-num-seqs N` / `--max-num-seqs=N` among vLLM's extra arguments."""
    found = None
    for i, arg in enumerate(extra_args):
        value = None
        if arg == "--max-num-seqs" and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith("--max-num-seqs="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit() and int(value) > 0:
            found = int(value)
    return found


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def fit_step_time(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(base seconds, seconds per token) of `train_time_s ~ base + per_token * batch_tokens`;
    None with fewer than MIN_STEPS usable rows. Non-negative: a negative slope falls back to
    the median time as the base."""
    points = [
        (float(r["batch_tokens"]), float(r["train_time_s"]))
        for r in rows
        if isinstance(r.get("batch_tokens"), int | float)
        and isinstance(r.get("train_time_s"), int | float)
    ]
    if len(points) < MIN_STEPS:
        return None
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var > 0 else 0.0
    base = my - slope * mx
    if slope <= 0 or base < 0:
        return (statistics.median(ys), 0.0) if slope <= 0 else (0.0, my / mx if mx else 0.0)
    return base, slope


def implied_defaults(cfg: Any, sim: SimConfig) -> Implied:
    """`sim` with the fields the user left unset taken from what `cfg` implies."""
    given = sim.model_fields_set
    changes: dict[str, Any] = {}
    sources: dict[str, str] = {}
    sources["servers"] = "[simulate] servers" if sim.servers else "inference.num_servers"
    if "max_seqs" in given:
        sources["max_seqs"] = "[simulate] max_seqs"
    else:
        seqs = _max_num_seqs(list(cfg.inference.extra_args))
        if seqs is not None:
            changes["max_seqs"] = seqs
            sources["max_seqs"] = "--max-num-seqs in inference.extra_args"
    step_fields = {"train_base_s", "train_per_token_s"}
    # the config's own run directory when it names one (the default runs/train is anybody's)
    candidates = [Path(cfg.log.run_dir)] if "run_dir" in cfg.log.model_fields_set else []
    if sim.trace and Path(sim.trace).is_dir():
        candidates.insert(0, Path(sim.trace))
    for run_dir in candidates:
        rows = _metrics(run_dir)
        if not rows:
            continue
        where = f"fitted to {run_dir / 'metrics.jsonl'} ({len(rows)} steps)"
        fitted = fit_step_time(rows)
        if fitted is not None and not step_fields & given:
            changes["train_base_s"], changes["train_per_token_s"] = fitted
            sources["train_base_s"] = where
        updates = [
            r["weight_update_s"] for r in rows if isinstance(r.get("weight_update_s"), int | float)
        ]
        if len(updates) >= MIN_STEPS and "update_s" not in given:
            changes["update_s"] = statistics.median(updates)
            sources["update_s"] = f"the median weight_update_s of {run_dir / 'metrics.jsonl'}"
        break
    if step_fields & given:
        sources["train_base_s"] = "[simulate] train_base_s / train_per_token_s"
    if "update_s" in given:
        sources["update_s"] = "[simulate] update_s"
    if changes:
        sim = sim.model_copy(update=changes)
        sim.model_fields_set.difference_update(changes)  # still implied, not user-set
    return Implied(sim, sources)
