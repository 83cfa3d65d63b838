"""`rlkit env audit`: play exploit policies through an environment and say which ones pay.

A reward is a contract with an optimiser: RL finds whatever it pays for. The audit plays every
exploit (`rlkit.envs.exploits`: the generic battery, the environment's own, installed entry
points) on a sample of rows through the environment's real `rollout` and rubric, tools executed
as in training (`rlkit.envs.check.play`), and compares each with the floor an empty reply scores
and with the gold completion.

An exploit fails the audit when, over all its variants, it
- reaches the maximum reward on any row, or
- averages more than the empty reply's mean plus `margin` x (max - min reward).
A two-way exploit (its two variants are the options of a two-way question) is reported apart:
a blind guess earns about half, so it fails only on a lopsided split a constant answer can farm:
when the first option's share of the two options' reward (the balance) is further from 1/2 than
`two_way_margin` plus the 95% interval of a fair coin over that many wins (a handful of rows
cannot show a lopsided split). A rollout that errors scores the minimum, as in training, and is
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlkit.envs.check import TOLERANCE, _remote, _target, play
from rlkit.envs.environment import Environment, Messages
from rlkit.envs.exploits import Exploit, exploits_for, reply
from rlkit.envs.scripted_server import ScriptedServer
from rlkit.hub.records import MAX_AUDIT_EXPLOITS, AuditRecord, AuditRow, clip_text, finite

DEFAULT_MARGIN = 0.05
DEFAULT_TWO_WAY_MARGIN = 0.1
Z95 = 1.96


class VariantResult(BaseModel):
    """One variant of one exploit, over the rows it applies to."""

    name: str = Field(..., description="Variant name.")
    rewards: list[float] = Field(default_factory=list, description="Reward per row played.")
    example_ids: list[int | str] = Field(default_factory=list, description="Rows played.")
    errors: int = Field(0, description="Rollouts that errored (scored the minimum).")
    first_error: str | None = Field(None, description="The first error message, if any.")

    @property
    def mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0


class ExploitResult(BaseModel):
    """One exploit's row of the audit table."""

    name: str
    family: str = "generic"
    description: str = ""
    two_way: bool = False
    variants: list[VariantResult] = Field(default_factory=list)
    full_reward_rows: list[str] = Field(
        default_factory=list, description="'example_id (variant)' where the maximum was reached."
    )
    problem: str | None = Field(None, description="Why it fails the audit; None: it does not.")

    @property
    def best(self) -> VariantResult | None:
        played = [v for v in self.variants if v.rewards]
        return max(played, key=lambda v: v.mean) if played else None

    @property
    def mean(self) -> float:
        best = self.best
        return best.mean if best else 0.0

    @property
    def rows(self) -> int:
        return len({i for v in self.variants for i in v.example_ids})

    @property
    def errors(self) -> int:
        return sum(v.errors for v in self.variants)

    @property
    def full_reward_row_ids(self) -> set[str]:
        """Rows (not row x variant pairs) where some variant reached the maximum."""
        return {entry.split(" (", 1)[0] for entry in self.full_reward_rows}

    @property
    def balance(self) -> float | None:
        """Two-way: the share of full-reward rows the first option takes (0.5: balanced)."""
        if not self.two_way or len(self.variants) != 2:
            return None
        first, second = (sum(v.rewards) for v in self.variants)
        return first / (first + second) if first + second > 0 else None


class AuditReport(BaseModel):
    """Everything `rlkit env audit` found about one environment (`--json` prints this)."""

    env_id: str = ""
    split: str = "eval"
    rows: int = 0
    min_reward: float = 0.0
    max_reward: float = 1.0
    empty_mean: float = 0.0
    gold_mean: float | None = Field(None, description="Gold completions' mean (None: no gold).")
    margin: float = DEFAULT_MARGIN
    two_way_margin: float = DEFAULT_TWO_WAY_MARGIN
    exploits: list[ExploitResult] = Field(default_factory=list)

    @property
    def floor(self) -> float:
        """The mean an exploit may not exceed: empty's mean plus the margin of the range."""
        return self.empty_mean + self.margin * (self.max_reward - self.min_reward)

    @property
    def failures(self) -> list[ExploitResult]:
        return [e for e in self.exploits if e.problem is not None]

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> list[dict[str, Any]]:
        """One plain dict per exploit: what the hub page and `env info` show."""
        rows = []
        for e in self.exploits:
            best = e.best
            rows.append(
                {
                    "exploit": e.name,
                    "family": e.family,
                    "best variant": best.name if best else "-",
                    "mean": round(e.mean, 4),
                    "rows": e.rows,
                    "full reward rows": len(e.full_reward_rows),
                    "errors": e.errors,
                    "two-way balance": None if e.balance is None else round(e.balance, 3),
                    "verdict": "FAIL: " + e.problem if e.problem else "ok",
                }
            )
        return rows


def judge(result: ExploitResult, report: AuditReport) -> str | None:
    """Why `result` fails the audit (see the module docstring), or None."""
    if not any(v.rewards for v in result.variants):
        return None
    if result.two_way:
        balance = result.balance
        if balance is None:
            return None
        span = report.max_reward - report.min_reward
        wins = sum(sum(v.rewards) - report.min_reward * len(v.rewards) for v in result.variants)
        allowed = report.two_way_margin + Z95 * 0.5 / math.sqrt(max(wins / span, 1.0))
        if abs(balance - 0.5) > allowed:
            return (
                f"lopsided two-way split: the first option takes {balance:.3f} of the wins "
                f"(a fair split is 0.5 +- {allowed:.3f} over {wins / span:.0f} wins)"
            )
        return None
    if result.full_reward_rows:
        shown = ", ".join(result.full_reward_rows[:5])
        more = len(result.full_reward_rows) - 5
        return f"full reward on {shown}" + (f" and {more} more" if more > 0 else "")
    if result.mean > report.floor + TOLERANCE:
        best = result.best
        name = best.name if best else "?"
        return f"mean {result.mean:.3f} ({name}) above the floor {report.floor:.3f}"
    return None


async def _score(
    env: Environment,
    row: dict[str, Any],
    script: Messages,
    repeat: bool,
    server: ScriptedServer | None,
) -> tuple[float, str | None]:
    """The reward of `script` on `row` and the rollout's error (errored: the minimum)."""
    target = _target(env, row)
    low, _ = target.reward_bounds()
    try:
        rollout, _ = await play(env, row, script, repeat, server if _remote(target) else None)
    except Exception as exc:  # the environment's bug, not the exploit's win
        return low, f"{type(exc).__name__}: {exc}"
    if rollout.error is not None:
        return low, rollout.error
    return float(rollout.reward), None


def _variants(exploit: Exploit, env: Environment, row: dict[str, Any]) -> dict[str, Messages]:
    try:
        return exploit.variants(_target(env, row), row)
    except Exception as exc:
        raise RuntimeError(
            f"exploit {exploit.name!r} failed to build its replies for row "
            f"{row.get('example_id')}: {type(exc).__name__}: {exc}"
        ) from exc


async def audit_rows(
    env: Environment,
    rows: list[dict[str, Any]],
    exploits: Iterable[Exploit],
    margin: float = DEFAULT_MARGIN,
    two_way_margin: float = DEFAULT_TWO_WAY_MARGIN,
    max_concurrent: int = 8,
    split: str = "eval",
) -> AuditReport:
    """Play the empty reply, the gold completions and every exploit's variants on `rows`."""
    exploits = list(exploits)
    semaphore = asyncio.Semaphore(max_concurrent)
    low, high = env.reward_bounds()
    remote = any(_remote(_target(env, row)) for row in rows)
    with ScriptedServer() if remote else contextlib.nullcontext() as server:

        async def bounded(row: dict[str, Any], script: Messages, repeat: bool) -> Any:
            async with semaphore:
                return await _score(env, row, script, repeat, server)

        empty = [bounded(row, reply(""), True) for row in rows]
        golds = []
        for row in rows:
            with contextlib.suppress(Exception):  # `env check --gold` reports broken gold
                script = env.gold_completion(row)
                if script:
                    golds.append(bounded(row, script, False))
        plays: list[tuple[int, str, int, Any]] = []
        results = [
            ExploitResult(
                name=e.name, family=e.family, description=e.description, two_way=e.two_way
            )
            for e in exploits
        ]
        for index, exploit in enumerate(exploits):
            names: dict[str, VariantResult] = {}
            for row_index, row in enumerate(rows):
                for name, script in _variants(exploit, env, row).items():
                    if name not in names:
                        names[name] = VariantResult(name=name)
                        results[index].variants.append(names[name])
                    plays.append((index, name, row_index, bounded(row, script, True)))
        empty_scores = await asyncio.gather(*empty)
        gold_scores = await asyncio.gather(*golds)
        scores = await asyncio.gather(*(p[3] for p in plays))

    report = AuditReport(
        env_id=env.env_id,
        split=split,
        rows=len(rows),
        min_reward=low,
        max_reward=high,
        empty_mean=sum(s for s, _ in empty_scores) / max(len(empty_scores), 1),
        gold_mean=(sum(s for s, _ in gold_scores) / len(gold_scores)) if gold_scores else None,
        margin=margin,
        two_way_margin=two_way_margin,
        exploits=results,
    )
    for (index, name, row_index, _), (score, error) in zip(plays, scores, strict=True):
        result = results[index]
        variant = next(v for v in result.variants if v.name == name)
        example_id = rows[row_index].get("example_id", row_index)
        variant.rewards.append(score)
        variant.example_ids.append(example_id)
        if error is not None:
            variant.errors += 1
            variant.first_error = variant.first_error or error[:500]
        if score >= high - TOLERANCE and not result.two_way:
            result.full_reward_rows.append(f"{example_id} ({name})")
    for result in results:
        result.problem = judge(result, report)
    return report


def audit_environment(env: Environment, **options: Any) -> AuditReport:
    """`audit_environment_async` (same keyword options) run to completion from sync code."""
    return asyncio.run(audit_environment_async(env, **options))


async def audit_environment_async(
    env: Environment,
    num_rows: int = 10,
    split: Literal["eval", "train"] = "eval",
    only: list[str] | None = None,
    margin: float = DEFAULT_MARGIN,
    two_way_margin: float = DEFAULT_TWO_WAY_MARGIN,
    max_concurrent: int = 8,
) -> AuditReport:
    """Audit the first `num_rows` rows of a split (the other split when it is missing);
    `only` keeps the exploits with these names (a name that matches none is a ValueError)."""
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    if not 0 <= margin < 1 or not 0 <= two_way_margin < 0.5:
        raise ValueError(
            f"need 0 <= margin < 1 and 0 <= two_way_margin < 0.5, got {margin}, {two_way_margin}"
        )
    if (env.eval_dataset if split == "eval" else env.dataset) is None:
        split = "train" if split == "eval" else "eval"
    dataset = env.get_eval_dataset(num_rows) if split == "eval" else env.get_dataset(num_rows)
    rows = [dict(row) for row in dataset]
    exploits = exploits_for(env)
    if only:
        known = {e.name for e in exploits}
        unknown = sorted(set(only) - known)
        if unknown:
            raise ValueError(f"unknown exploit(s) {unknown}; this environment has {sorted(known)}")
        exploits = [e for e in exploits if e.name in only]
    return await audit_rows(
        env, rows, exploits, margin, two_way_margin, max_concurrent, split=split
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report_lines(report: AuditReport) -> list[str]:
    """A plain-text table: one line per exploit, two-way exploits apart, then the verdict."""
    lines = [
        f"audit of {report.env_id}: {report.rows} {report.split} rows; reward range "
        f"[{report.min_reward:g}, {report.max_reward:g}]; gold mean {_fmt(report.gold_mean)}, "
        f"empty mean {report.empty_mean:.3f}, floor {report.floor:.3f} (empty + "
        f"{report.margin:g} of the range)",
        f"{'exploit':<28} {'family':<10} {'mean':>6} {'rows':>5} {'full':>5} {'err':>4}  "
        f"best variant / verdict",
    ]
    for two_way in (False, True):
        group = [e for e in report.exploits if e.two_way == two_way]
        if two_way and group:
            lines.append(
                "two-way guesses (a blind guess earns about half; balance = first option's share):"
            )
        for e in group:
            best = e.best
            if best is None:
                lines.append(f"{e.name:<28} {e.family:<10} {'-':>6}  (no applicable rows)")
                continue
            note = f"balance {_fmt(e.balance)}" if two_way else best.name
            verdict = f"FAIL: {e.problem}" if e.problem else "ok"
            lines.append(
                f"{e.name:<28} {e.family:<10} {e.mean:>6.3f} {e.rows:>5} "
                f"{len(e.full_reward_rows):>5} {e.errors:>4}  {note[:40]} / {verdict}"
            )
    failures = report.failures
    lines.append(
        "OK: no exploit beats the floor"
        if not failures
        else f"{len(failures)} exploit(s) earn reward without the task: "
        + ", ".join(e.name for e in failures)
    )
    return lines


def hub_record(report: AuditReport, exploits_allowed: bool = False) -> AuditRecord:
    """What a hub keeps of an audit with the version it publishes (bounded, finite numbers)."""
    table = [
        AuditRow(
            exploit=clip_text(e.name, 200),
            family=clip_text(e.family, 100),
            best_variant=clip_text(row["best variant"], 200),
            mean=finite(e.mean),
            rows=e.rows,
            full_reward_rows=len(e.full_reward_row_ids),
            errors=e.errors,
            two_way=e.two_way,
            two_way_balance=finite(e.balance, 3),
            verdict=clip_text(row["verdict"], 1000),
        )
        for e, row in zip(report.exploits, report.table(), strict=True)
    ]
    return AuditRecord(
        rows=report.rows,
        split=report.split,
        min_reward=finite(report.min_reward),
        max_reward=finite(report.max_reward),
        gold_mean=finite(report.gold_mean),
        empty_mean=finite(report.empty_mean),
        floor=finite(report.floor),
        ok=report.ok,
        exploits_allowed=exploits_allowed,
        table=table[:MAX_AUDIT_EXPLOITS],
    )


def report_json(report: AuditReport) -> str:
    """The report as one JSON object, with the table and the verdict."""
    data = report.model_dump()
    data.update(ok=report.ok, floor=report.floor, table=report.table())
    return json.dumps(data)
