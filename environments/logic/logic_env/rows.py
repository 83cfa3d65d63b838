"""Dataset rows from reasoning-gym generators: deterministic per seed, training never overlaps
evaluation.

Each (task, level) draws from its own generator, seeded from a hash of `seed/task/level` (the
frozen eval set used the `eval` namespace), so adding a task never changes another task's rows.
Training rows whose question appears in the evaluation set are skipped; evaluation rows are also
distinct from each other.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from logic_env.tasks import TASKS, gold_answer, level_config, make_dataset

MAX_DRAWS_PER_ROW = 20


def generator_seed(namespace: str, task: str, level: str) -> int:
    """A 31-bit seed for one task and level (stable across Python versions and runs)."""
    digest = hashlib.sha256(f"{namespace}/{task}/{level}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def make_row(task: str, level: str, config: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A dataset row; `info` carries what scoring needs as JSON strings (one Arrow schema)."""
    return {
        "question": entry["question"],
        "answer": gold_answer(task, entry),
        "info": {
            "task": task,
            "level": level,
            "category": TASKS[task][0],
            "config": config,
            "entry": json.dumps(entry, default=str),
        },
    }


def generate_rows(
    task: str,
    level: str,
    count: int,
    namespace: str,
    exclude: set[str] | None = None,
    distinct: bool = False,
) -> list[dict[str, Any]]:
    """`count` rows of a task at a level; questions in `exclude` are skipped (and, with
    `distinct`, repeats too). Raises ValueError when the generator cannot supply enough."""
    exclude = set(exclude or ())
    config = level_config(task, level)
    draws = MAX_DRAWS_PER_ROW * count + 100
    dataset = make_dataset(task, config, generator_seed(namespace, task, level), draws)
    rows: list[dict[str, Any]] = []
    for index in range(draws):
        if len(rows) == count:
            break
        entry = dataset[index]
        if entry["question"] in exclude:
            continue
        if distinct:
            exclude.add(entry["question"])
        rows.append(make_row(task, level, config, entry))
    if len(rows) < count:
        raise ValueError(
            f"logic: {task} ({level}) gave only {len(rows)} of {count} new rows in {draws} draws"
        )
    return rows
