"""Dataset rows from reasoning-gym generators: deterministic per seed, training never overlaps
evaluation.

Each (task, level) draws from its own generator, seeded from a hash of `seed/task/level` (the
frozen eval set used the `eval` namespace), so adding a task never changes another task's rows.
Training rows whose question appears in the evaluation set are skipped; evaluation rows are also
distinct from each other. Draws are also skipped to keep a task's answer split balanced
(`tasks.answer_class`): at every prefix of the rows, no option holds more than its share of
its group's rows (rounded up), so a constant answer earns no more than its share; and draws of
a kind the task never serves (an infeasible shortest path, premises with nothing to derive) are
skipped.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

from logic_env.tasks import TASKS, answer_class, gold_answer, level_config, make_dataset

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
    groups: Counter[str] = Counter()
    options: Counter[tuple[str, str]] = Counter()
    for index in range(draws):
        if len(rows) == count:
            break
        entry = dataset[index]
        if entry["question"] in exclude:
            continue
        classes = answer_class(task, entry)
        if classes is None or any(
            options[(group, option)] + 1 > math.ceil(share * (groups[group] + 1) - 1e-9)
            for group, option, share in classes
        ):
            continue
        for group, option, _ in classes:
            groups[group] += 1
            options[(group, option)] += 1
        if distinct:
            exclude.add(entry["question"])
        rows.append(make_row(task, level, config, entry))
    if len(rows) < count:
        raise ValueError(
            f"logic: {task} ({level}) gave only {len(rows)} of {count} new rows in {draws} draws"
        )
    return rows
