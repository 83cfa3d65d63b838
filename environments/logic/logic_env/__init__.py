"""logic: procedurally generated puzzles from reasoning-gym, scored by each task's own verifier.

`load_environment(tasks=..., weights=..., difficulty=..., num_train_examples=...,
num_eval_examples=..., seed=...)`. Seventeen curated tasks (constraint grids, deduction,
arithmetic search, sequences, symbolic logic, graphs; see `tasks.py`) each have easy / medium /
hard levels mapped to generator knobs. The model reasons, then answers inside
`<answer>...</answer>`; the reward is the task's verifier on that answer (`tasks.score`:
partial credit only for work the prompt does not already give, nothing a constant earns), and
`answer_format` (weight 0) records whether the tags were there. Every row's `info`
names its `task`, `level` and `category`, so `rlkit eval` reports reward per task.

Evaluation rows come from the frozen file shipped in `data/` (see `freeze.py` and
`data/manifest.json` for the reasoning-gym version that generated them). Training rows are
generated from `seed` on first use (an eval never pays for them) and never repeat an
evaluation question. The module is `logic_env` (the package id is `logic`).
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import warnings
from collections import Counter
from typing import Any

from datasets import Dataset

from logic_env.answer import AnswerTagParser, extract_answer, format_answer
from logic_env.exploits import LOGIC_EXPLOITS
from logic_env.freeze import EVAL_FILE, MANIFEST_FILE
from logic_env.rows import generate_rows
from logic_env.tasks import LEVEL_NAMES, TASKS, score
from rlkit.envs import Rubric, SingleTurnEnv

SYSTEM_PROMPT = (
    "Solve the puzzle. Think it through step by step, then give only your final answer, in the "
    "format the puzzle asks for, inside <answer></answer> tags."
)
TRAIN_NAMESPACE = "train"

__all__ = ["LogicEnv", "extract_answer", "format_answer", "load_environment"]


def _names(value: str | list[str]) -> list[str]:
    """A list or a comma-separated string of names, stripped, empty ones dropped."""
    names = value.split(",") if isinstance(value, str) else list(value)
    return [n.strip() for n in names if n.strip()]


def _levels(difficulty: str | list[str]) -> list[str]:
    names = _names(difficulty)
    if names == ["all"]:
        return list(LEVEL_NAMES)
    unknown = [n for n in names if n not in LEVEL_NAMES]
    if unknown or not names:
        raise ValueError(
            f"difficulty must be 'all' or levels from {LEVEL_NAMES}, got {difficulty!r}"
        )
    return [level for level in LEVEL_NAMES if level in names]


def _tasks(tasks: list[str] | str | None) -> list[str]:
    if tasks is None:
        return list(TASKS)
    names = _names(tasks)
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ValueError(
            f"unknown logic task(s) {unknown or names}; choose from {', '.join(TASKS)}"
        )
    return list(dict.fromkeys(names))


def apportion(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split `total` in proportion to `weights` (largest remainders, ties in key order)."""
    exact = {key: total * w / sum(weights.values()) for key, w in weights.items()}
    counts = {key: int(value) for key, value in exact.items()}
    by_remainder = sorted(weights, key=lambda key: exact[key] - counts[key], reverse=True)
    for key in by_remainder[: total - sum(counts.values())]:
        counts[key] += 1
    return counts


def train_plan(
    tasks: list[str], levels: list[str], weights: dict[str, float], total: int
) -> list[tuple[str, str, int]]:
    """(task, level, rows): tasks share `total` rows by weight, each task evenly over levels."""
    bad = {t: w for t, w in weights.items() if t not in tasks or w < 0}
    if bad:
        raise ValueError(f"weights must be >= 0 and name selected tasks {tasks}, got {bad}")
    share = {t: float(weights.get(t, 1.0)) for t in tasks}
    if total > 0 and sum(share.values()) <= 0:
        raise ValueError("at least one task needs a positive weight")
    plan = []
    for task, rows in (apportion(total, share) if total > 0 else {}).items():
        for level, count in apportion(rows, dict.fromkeys(levels, 1.0)).items():
            if count > 0:
                plan.append((task, level, count))
    return plan


def frozen_eval_rows(tasks: list[str], levels: list[str], per_level: int) -> list[dict[str, Any]]:
    """The shipped evaluation rows of the chosen tasks and levels (first `per_level` of each)."""
    taken: Counter[tuple[str, str]] = Counter()
    rows = []
    for line in EVAL_FILE.read_text().splitlines():
        row = json.loads(line)
        key = (row["info"]["task"], row["info"]["level"])
        if key[0] in tasks and key[1] in levels and (per_level < 0 or taken[key] < per_level):
            taken[key] += 1
            rows.append(row)
    return rows


def _check_version() -> None:
    frozen = json.loads(MANIFEST_FILE.read_text())["reasoning_gym_version"]
    installed = importlib.metadata.version("reasoning-gym")
    if installed != frozen:
        warnings.warn(
            f"logic: the eval set was generated with reasoning-gym {frozen}, {installed} is "
            "installed; rows are unchanged but verifiers may score differently",
            stacklevel=3,
        )


class LogicEnv(SingleTurnEnv):
    """Single-turn puzzles whose training rows are generated when first needed."""

    def __init__(
        self, plan: list[tuple[str, str, int]], eval_questions: set[str], seed: int, **kwargs: Any
    ) -> None:
        self._plan = plan
        self._eval_questions = eval_questions
        self._seed = seed
        # Without eval rows there is nothing to defer: the base class needs one of the two.
        eager = self._generate() if kwargs.get("eval_dataset") is None and plan else None
        super().__init__(dataset=eager, **kwargs)

    def _generate(self) -> Dataset:
        rows = [
            row
            for task, level, count in self._plan
            for row in generate_rows(
                task, level, count, f"{TRAIN_NAMESPACE}/{self._seed}", self._eval_questions
            )
        ]
        random.Random(self._seed).shuffle(rows)
        return Dataset.from_list(rows)

    def _raw_rows(self, split: str) -> Dataset | None:
        rows = super()._raw_rows(split)
        if rows is None and split == "train" and self._plan:
            return self._generate()
        return rows

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        reasoning = "I checked every constraint of the puzzle; this is the solution."
        return [{"role": "assistant", "content": format_answer(row["answer"], reasoning)}]


def load_environment(
    tasks: list[str] | str | None = None,
    weights: dict[str, float] | None = None,
    difficulty: str | list[str] = "all",
    num_train_examples: int = 1000,
    num_eval_examples: int = -1,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> LogicEnv:
    """Build the environment.

    tasks: task names (list or comma-separated; default: all curated tasks).
    weights: task -> relative share of the training rows (default 1 each).
    difficulty: 'all', a level, a comma-separated list or a list of levels.
    num_train_examples: training rows in total (0: evaluation only).
    num_eval_examples: frozen eval rows per task and level (-1: all shipped).
    seed: training rows' seed (the frozen eval set does not depend on it).
    """
    chosen, levels = _tasks(tasks), _levels(difficulty)
    if num_train_examples < 0:
        raise ValueError(f"num_train_examples must be >= 0, got {num_train_examples}")
    _check_version()
    eval_rows = frozen_eval_rows(chosen, levels, num_eval_examples)
    plan = train_plan(chosen, levels, dict(weights or {}), num_train_examples)
    parser = AnswerTagParser()

    def correct_answer(completion: list[dict[str, Any]], info: dict[str, Any]) -> float:
        answer = parser.parse_answer(completion)
        if answer is None:
            return 0.0
        return score(info["task"], info["config"], answer, json.loads(info["entry"]))

    def answer_format(completion: list[dict[str, Any]]) -> float:
        """Format metric (weight 0): an answer in <answer> tags after the reasoning."""
        return float(parser.parse_answer(completion) is not None)

    env = LogicEnv(
        plan,
        {row["question"] for row in eval_rows},
        seed,
        eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None,
        system_prompt=system_prompt,
        parser=parser,
        rubric=Rubric([correct_answer, answer_format], [1.0, 0.0], parser=parser),
        sampling_defaults={"temperature": 1.0, "max_tokens": 4096},
        env_id="logic",
    )
    env.exploits.extend(LOGIC_EXPLOITS)  # the family's cheap policies for `rlkit env audit`
    return env
