"""Errored rollouts, kept and grouped by cause: what a researcher reads when rollouts fail.

A training run appends one record per errored rollout (training and interleaved eval) to
`run_dir/errors.jsonl`: the step, the phase, the environment, the example and the full message.
`rlkit eval` keeps its rollouts (errors included) in results.jsonl. Both are read back through
the same grouping: `error_cause` turns a message into a short cause ("sandbox service
unreachable", "reward function 'passed' raised ValueError"), `cause_lines` prints
"46 of 176: sandbox service unreachable" (most frequent first), and `detail_lines` gives every
message in full, one record per line, never cut (`--errors`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

ERRORS_FILE = "errors.jsonl"

_TYPE = r"([A-Za-z_][\w.]*)"  # an exception's type name, as `f"{type(exc).__name__}: {exc}"`
# (pattern, cause) in order: the first match names the cause. The sandbox service comes first:
# its failure reaches a rollout through a reward function or a tool.
_CAUSES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"sandbox service \S+: (ClientConnector|ServerDisconnected|Connection)", re.I),
        "sandbox service unreachable",
    ),
    (re.compile(r"sandbox service \S+ busy past"), "sandbox service busy (queue wait exceeded)"),
    (re.compile(r"sandbox service \S+: HTTP (\d+)"), r"sandbox service answered HTTP \1"),
    (re.compile(r"at most [\d.]+ s and \d+ MiB"), "sandbox refused the environment's limits"),
    (re.compile(r"chat.template", re.I), "the model has no chat template"),
    (re.compile(r"^reward function ('[^']*') failed: " + _TYPE), r"reward function \1 raised \2"),
    (re.compile(r"^scoring failed: " + _TYPE), r"scoring raised \1"),
    (re.compile(r"^rollout failed: " + _TYPE), r"rollout raised \1"),
    (re.compile(r"^environment error: " + _TYPE), r"environment raised \1"),
    (re.compile(r"^generation failed: .*?HTTP (\d+)"), r"generation failed (HTTP \1)"),
    (re.compile(r"^generation failed"), "generation failed"),
    (re.compile(r"^context: "), "prompt does not fit the model's context"),
]


def error_cause(message: str | None) -> str:
    """A short, stable cause for an error message (rollouts with one cause group together)."""
    text = str(message or "no message")
    for pattern, cause in _CAUSES:
        found = pattern.search(text)
        if found:
            return found.expand(cause)
    head = text.split(": ", 1)[0].strip()
    return head[:80] or "no message"


def cause_key(cause: str) -> str:
    """A cause as a metric-name part: `rollouts_errored/<key>` in every logger."""
    return re.sub(r"[^a-z0-9]+", "_", cause.lower()).strip("_") or "unknown"


def cause_counts(messages: list[str | None]) -> Counter[str]:
    return Counter(error_cause(m) for m in messages)


def cause_lines(counts: Counter[str], total: int) -> list[str]:
    """'46 of 176: sandbox service unreachable', most frequent cause first."""
    return [f"{n} of {total}: {cause}" for cause, n in counts.most_common()]


def error_record(
    *,
    env_id: str,
    example_id: Any,
    error: str | None,
    phase: str,
    step: int | None = None,
    **where: Any,
) -> dict[str, Any]:
    """One errored rollout as errors.jsonl keeps it."""
    return {
        "step": step,
        "phase": phase,
        "env_id": env_id,
        "example_id": example_id,
        **where,
        "cause": error_cause(error),
        "error": error,
    }


def append_errors(run_dir: Path, records: list[dict[str, Any]]) -> None:
    if records:
        with open(Path(run_dir) / ERRORS_FILE, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


def detail_lines(records: list[dict[str, Any]]) -> list[str]:
    """Every errored rollout, grouped by cause: where it happened, then its full message."""
    by_cause: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_cause.setdefault(record.get("cause") or error_cause(record.get("error")), []).append(
            record
        )
    lines = []
    for cause, group in sorted(by_cause.items(), key=lambda item: -len(item[1])):
        lines.append(f"{cause} ({len(group)}):")
        for r in group:
            where = " ".join(
                f"{k} {r[k]}"
                for k in ("phase", "step", "env_id", "example_id", "example", "rollout")
                if r.get(k) is not None
            )
            lines.append(f"  {where}: {r.get('error')}")
    return lines
