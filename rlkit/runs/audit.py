"""`rlkit runs audit RUN_DIR`: did every step run once and every prompt train exactly once?

Read from what a run leaves on disk, after any crash and resume:
- steps: `metrics.jsonl` (orchestrator) and `trainer_metrics.jsonl` must each hold every step
  1..L exactly once (L the last step either logged), and each step a batch file
  `batches/step_N.pt` whose own step is N;
- prompts: every batch records the prompts it trains and those dropped since the previous
  batch (`rlkit.orchestrator.prompts`); with the newest orchestrator state (step A, the prompts
  still owed then and the next draw number D), every draw 0..D-1 must be settled exactly once
  over batches 1..A (trained or dropped) or owed at A: a draw found nowhere was skipped, one
  found twice was trained twice. Per environment and sampler epoch, no example may be trained
  twice (draws from the easy/hard pools, epoch -1, repeat by design and are left out).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.errors import UsageError
from rlkit.protocol.batch import read_batch_header
from rlkit.protocol.layout import RunLayout, step_of


@dataclass
class EpochCount:
    """Prompts of one environment's sampler epoch: trained, dropped, owed at the end."""

    trained: int = 0
    dropped: int = 0
    owed: int = 0


@dataclass
class AuditReport:
    run_dir: Path
    last_step: int = 0
    batches: list[int] = field(default_factory=list)
    draws: int = 0  # prompts handed out (the next draw number at the newest state)
    state_step: int | None = None
    trained: int = 0
    dropped: int = 0
    owed: int = 0
    epochs: dict[tuple[str, int], EpochCount] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        """The human-readable report, one finding per line."""
        out = [
            f"run {self.run_dir}: steps 1-{self.last_step} logged, {len(self.batches)} batch files",
        ]
        if self.state_step is not None:
            out.append(
                f"prompts: {self.draws} handed out; {self.trained} trained, {self.dropped} "
                f"dropped, {self.owed} owed at step {self.state_step} (newest orchestrator state)"
            )
        for (env_id, epoch), count in sorted(self.epochs.items()):
            label = f"epoch {epoch}" if epoch >= 0 else "easy/hard pools"
            out.append(
                f"{env_id} {label}: {count.trained} prompts trained, {count.dropped} dropped, "
                f"{count.owed} owed"
            )
        out += [f"VIOLATION: {v}" for v in self.violations]
        out.append(
            "OK: every step once, no prompt skipped or trained twice"
            if self.ok
            else f"{len(self.violations)} violation(s)"
        )
        return out


def _read_steps(path: Path, report: AuditReport) -> list[int]:
    if not path.exists():
        report.violations.append(f"{path.name} is missing")
        return []
    steps = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            report.violations.append(f"{path.name} line {number} is not a step record")
    return steps


def _check_steps(name: str, steps: list[int], last: int, report: AuditReport) -> None:
    counts = Counter(steps)
    missing = [s for s in range(1, last + 1) if s not in counts]
    twice = sorted(s for s, n in counts.items() if n > 1)
    if missing:
        report.violations.append(f"{name}: steps missing: {_span(missing)}")
    if twice:
        report.violations.append(f"{name}: steps logged more than once: {_span(twice)}")


def _span(values: list[int]) -> str:
    return ", ".join(map(str, values[:20])) + (
        f" and {len(values) - 20} more" if len(values) > 20 else ""
    )


def _read_batch_meta(path: Path, report: AuditReport) -> dict[str, Any] | None:
    """The batch's meta plus `_step` and `_samples`; None (and a violation) if unreadable."""
    try:
        header = read_batch_header(path)
        return {**header.meta, "_step": header.step, "_samples": header.samples}
    except Exception as exc:  # any unreadable batch is a finding, not a crash of the audit
        report.violations.append(f"{path.name}: cannot read: {exc}")
        return None


def audit_run(run_dir: str | Path) -> AuditReport:
    """Audit the run in `run_dir` (see the module docstring); a bad path is a UsageError."""
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"RUN_DIR {run_dir} is not a directory")
    if not layout.metrics.exists() and not layout.batches.is_dir():
        raise UsageError(f"RUN_DIR {run_dir} holds no training run (no metrics.jsonl, no batches/)")
    report = AuditReport(run_dir)
    logged = _read_steps(layout.metrics, report)
    trained = _read_steps(layout.trainer_metrics, report)
    report.last_step = max([*logged, *trained], default=0)
    _check_steps(layout.metrics.name, logged, report.last_step, report)
    _check_steps(layout.trainer_metrics.name, trained, report.last_step, report)

    metas: dict[int, dict[str, Any]] = {}
    for path in layout.batch_files():
        meta = _read_batch_meta(path, report)
        if meta is None:
            continue
        step = step_of(path)
        if meta["_step"] != step:
            report.violations.append(f"{path.name} holds the batch of step {meta['_step']}")
        metas[step] = meta
    report.batches = sorted(metas)
    missing = [s for s in range(1, report.last_step + 1) if s not in metas]
    if missing:
        report.violations.append(f"batch files missing for logged steps: {_span(missing)}")
    _audit_prompts(run_dir, metas, report)
    return report


def _newest_state(run_dir: Path) -> dict[str, Any] | None:
    paths = RunLayout(run_dir).orchestrator_state_files()
    return json.loads(paths[-1].read_text()) if paths else None


def _audit_prompts(run_dir: Path, metas: dict[int, dict[str, Any]], report: AuditReport) -> None:
    """The prompt ledger over batches 1..A and the newest state A (module docstring)."""
    state = _newest_state(run_dir)
    if state is None or "prompts" not in state:
        report.violations.append("no orchestrator state with a prompt ledger to account against")
        return
    report.state_step = int(state["step"])
    report.draws = int(state["prompts"]["next_draw"])
    settled: dict[int, list[str]] = defaultdict(list)  # draw -> where it was settled
    per_epoch: dict[tuple[str, int], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for step, meta in sorted(metas.items()):
        if step > report.state_step:
            continue  # written after the newest state: rolled back by the next --resume
        if "prompts" not in meta:
            report.violations.append(f"batch of step {step} has no prompt records")
            continue
        records = meta["prompts"]
        if sum(r["samples"] for r in records) != meta["_samples"]:
            report.violations.append(
                f"batch of step {step}: its prompt records count "
                f"{sum(r['samples'] for r in records)} samples, it holds {meta['_samples']}"
            )
        for r in records:
            settled[r["draw"]].append(f"trained in step {step}")
            report.trained += 1
            key = (r["env_id"], r["epoch"])
            report.epochs.setdefault(key, EpochCount()).trained += 1
            per_epoch[key][r["index"]].append(step)
        for r in meta.get("dropped", []):
            settled[r["draw"]].append(f"dropped ({r['reason']}) before step {step}")
            report.dropped += 1
            report.epochs.setdefault((r["env_id"], r["epoch"]), EpochCount()).dropped += 1
    for p in state["prompts"]["owed"]:
        settled[p["draw"]].append(f"owed at step {report.state_step}")
        report.owed += 1
        report.epochs.setdefault((p["env_id"], p["epoch"]), EpochCount()).owed += 1
    skipped = [d for d in range(report.draws) if d not in settled]
    if skipped:
        report.violations.append(
            f"prompts handed out but never trained or dropped: draws {_span(skipped)}"
        )
    for draw, where in sorted(settled.items()):
        if len(where) > 1:
            report.violations.append(
                f"prompt draw {draw} settled {len(where)} times: {'; '.join(where)}"
            )
        if draw >= report.draws:
            report.violations.append(
                f"prompt draw {draw} is past the stream's end ({report.draws})"
            )
    for (env_id, epoch), rows in sorted(per_epoch.items()):
        if epoch < 0:
            continue
        for index, steps in sorted(rows.items()):
            if len(steps) > 1:
                report.violations.append(
                    f"{env_id} example {index} trained {len(steps)} times in epoch {epoch} "
                    f"(steps {', '.join(map(str, steps))})"
                )
