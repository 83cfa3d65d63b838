"""The curated reasoning-gym tasks, their difficulty levels and their (guarded) verifiers.

Each task maps `easy` / `medium` / `hard` to keyword arguments of its reasoning-gym generator
config (board sizes, blanks, people, terms...). Scoring calls the task's own `score_answer`, so
tasks with many valid answers (graph colouring, countdown, propositional logic, n-queens,
cryptarithms) accept any valid one, and partial credit is kept. Three verifiers evaluate the
answer text as Python (`sympy.parse_expr` in countdown and puzzle24, `eval` in n_queens); their
answers are checked against what the task asks for before the verifier sees them, and anything
else scores 0. A verifier that raises on a malformed answer (e.g. RecursionError on thousands of
parentheses) also scores 0: the answer is wrong, not the environment.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset

LEVEL_NAMES = ("easy", "medium", "hard")

# task -> (category, {level: generator config})
TASKS: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "sudoku": (
        "constraint grid",
        {
            "easy": {"min_empty": 20, "max_empty": 30},
            "medium": {"min_empty": 35, "max_empty": 44},
            "hard": {"min_empty": 45, "max_empty": 52},
        },
    ),
    "mini_sudoku": (
        "constraint grid",
        {
            "easy": {"min_empty": 4, "max_empty": 6},
            "medium": {"min_empty": 7, "max_empty": 9},
            "hard": {"min_empty": 10, "max_empty": 12},
        },
    ),
    "futoshiki": (
        "constraint grid",
        {
            "easy": {
                "min_board_size": 4,
                "max_board_size": 4,
                "min_difficulty": 0,
                "max_difficulty": 0,
            },
            "medium": {
                "min_board_size": 5,
                "max_board_size": 5,
                "min_difficulty": 1,
                "max_difficulty": 1,
            },
            "hard": {
                "min_board_size": 6,
                "max_board_size": 6,
                "min_difficulty": 2,
                "max_difficulty": 3,
            },
        },
    ),
    "kakurasu": (
        "constraint grid",
        {
            "easy": {"min_rows": 3, "max_rows": 3, "min_cols": 3, "max_cols": 3},
            "medium": {"min_rows": 4, "max_rows": 5, "min_cols": 4, "max_cols": 5},
            "hard": {"min_rows": 6, "max_rows": 6, "min_cols": 6, "max_cols": 6},
        },
    ),
    "survo": (
        "constraint grid",
        {
            "easy": {"min_board_size": 4, "max_board_size": 4, "min_empty": 2, "max_empty": 3},
            "medium": {"min_board_size": 5, "max_board_size": 5, "min_empty": 4, "max_empty": 6},
            "hard": {"min_board_size": 6, "max_board_size": 6, "min_empty": 8, "max_empty": 12},
        },
    ),
    "n_queens": (
        "constraint grid",
        {
            "easy": {"n": 4, "min_remove": 1, "max_remove": 2},
            "medium": {"n": 6, "min_remove": 2, "max_remove": 4},
            "hard": {"n": 8, "min_remove": 5, "max_remove": 7},
        },
    ),
    "knights_knaves": (
        "deduction",
        {
            "easy": {"n_people": 2, "depth_constraint": 2, "width_constraint": 2},
            "medium": {"n_people": 3, "depth_constraint": 2, "width_constraint": 2},
            "hard": {"n_people": 4, "depth_constraint": 3, "width_constraint": 2},
        },
    ),
    "zebra_puzzles": (
        "deduction",
        {
            "easy": {"num_people": 3, "num_characteristics": 3},
            "medium": {"num_people": 4, "num_characteristics": 3},
            "hard": {"num_people": 4, "num_characteristics": 4},
        },
    ),
    "family_relationships": (
        "deduction",
        {
            "easy": {"min_family_size": 3, "max_family_size": 4},
            "medium": {"min_family_size": 5, "max_family_size": 6},
            "hard": {"min_family_size": 7, "max_family_size": 9},
        },
    ),
    "countdown": (
        "arithmetic search",
        {
            "easy": {"min_numbers": 3, "max_numbers": 3, "min_target": 10, "max_target": 100},
            "medium": {"min_numbers": 4, "max_numbers": 4, "min_target": 100, "max_target": 500},
            "hard": {"min_numbers": 5, "max_numbers": 6, "min_target": 100, "max_target": 999},
        },
    ),
    "puzzle24": (
        "arithmetic search",
        {
            "easy": {"min_value": 1, "max_value": 6},
            "medium": {"min_value": 1, "max_value": 8},
            "hard": {"min_value": 1, "max_value": 10},
        },
    ),
    "cryptarithm": (
        "arithmetic search",
        {
            "easy": {"min_words": 2, "max_words": 2},
            "medium": {"min_words": 3, "max_words": 3},
            "hard": {"min_words": 4, "max_words": 5},
        },
    ),
    "number_sequence": (
        "sequence",
        {
            "easy": {
                "min_terms": 4,
                "max_terms": 5,
                "min_value": -20,
                "max_value": 20,
                "max_complexity": 1,
            },
            "medium": {
                "min_terms": 5,
                "max_terms": 7,
                "min_value": -100,
                "max_value": 100,
                "max_complexity": 2,
            },
            "hard": {
                "min_terms": 7,
                "max_terms": 10,
                "min_value": -1000,
                "max_value": 1000,
                "max_complexity": 3,
            },
        },
    ),
    "propositional_logic": (
        "symbolic logic",
        {
            "easy": {
                "min_vars": 2,
                "max_vars": 2,
                "min_statements": 2,
                "max_statements": 3,
                "min_complexity": 1,
                "max_complexity": 1,
            },
            "medium": {
                "min_vars": 2,
                "max_vars": 3,
                "min_statements": 3,
                "max_statements": 4,
                "min_complexity": 1,
                "max_complexity": 2,
            },
            "hard": {
                "min_vars": 3,
                "max_vars": 4,
                "min_statements": 4,
                "max_statements": 5,
                "min_complexity": 2,
                "max_complexity": 3,
            },
        },
    ),
    "circuit_logic": (
        "symbolic logic",
        {
            "easy": {"min_terms": 2, "max_terms": 3, "min_inputs": 2, "max_inputs": 2},
            "medium": {"min_terms": 3, "max_terms": 4, "min_inputs": 2, "max_inputs": 3},
            "hard": {"min_terms": 4, "max_terms": 5, "min_inputs": 3, "max_inputs": 4},
        },
    ),
    "graph_color": (
        "graph",
        {
            "easy": {
                "num_colors": 3,
                "min_num_vertices": 6,
                "max_num_vertices": 6,
                "edge_probability": 0.2,
            },
            "medium": {
                "num_colors": 3,
                "min_num_vertices": 10,
                "max_num_vertices": 10,
                "edge_probability": 0.2,
            },
            "hard": {
                "num_colors": 3,
                "min_num_vertices": 15,
                "max_num_vertices": 15,
                "edge_probability": 0.25,
            },
        },
    ),
    "shortest_path": (
        "graph",
        {
            "easy": {"min_rows": 4, "max_rows": 5, "min_cols": 4, "max_cols": 5},
            "medium": {"min_rows": 6, "max_rows": 8, "min_cols": 6, "max_cols": 8},
            "hard": {"min_rows": 9, "max_rows": 12, "min_cols": 9, "max_cols": 12},
        },
    ),
}


def level_config(task: str, level: str) -> str:
    """A level's generator config as canonical JSON (stored with every row)."""
    return json.dumps(TASKS[task][1][level], sort_keys=True)


@cache
def make_dataset(task: str, config: str, seed: int = 0, size: int = 1) -> ProceduralDataset:
    """A reasoning-gym generator (row i is generated from seed + i); `config` is JSON."""
    return reasoning_gym.create_dataset(task, seed=seed, size=size, **json.loads(config))


def gold_answer(task: str, entry: dict[str, Any]) -> str:
    """An answer the task's verifier accepts in full (its oracle, or a worked example)."""
    if entry.get("answer") is not None:
        return str(entry["answer"])
    metadata = entry["metadata"]
    if task == "graph_color":
        return json.dumps(metadata["possible_answer"])
    if task == "propositional_logic":
        return str(metadata["example_answer"])
    raise ValueError(f"task {task!r}: the entry has no answer")


ARITHMETIC = re.compile(r"[0-9+\-*/().\s]{1,256}")
QUEENS_BOARD = re.compile(r"[_Q\s]{1,512}")


def _arithmetic_only(answer: str, entry: dict[str, Any]) -> bool:
    """countdown / puzzle24 feed answers to sympy's parse_expr (Python eval): allow only
    arithmetic on numbers, without `**` (a tower of powers would never finish)."""
    return bool(ARITHMETIC.fullmatch(answer)) and "**" not in answer


def _queens_safe(answer: str, entry: dict[str, Any]) -> bool:
    """n_queens evals answers that are not a board string: allow boards and pure literals."""
    if QUEENS_BOARD.fullmatch(answer):
        return True
    try:
        ast.literal_eval(answer)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _names_a_variable(answer: str, entry: dict[str, Any]) -> bool:
    """propositional_logic gives 0.25 to an 'answer' with no variable at all (any text)."""
    return any(var in answer for var in entry["metadata"]["variables"])


ANSWER_GUARDS: dict[str, Callable[[str, dict[str, Any]], bool]] = {
    "countdown": _arithmetic_only,
    "puzzle24": _arithmetic_only,
    "n_queens": _queens_safe,
    "propositional_logic": _names_a_variable,
}


def score(task: str, config: str, answer: str, entry: dict[str, Any]) -> float:
    """The task's own verifier (built with the row's generator config) on an extracted answer."""
    guard = ANSWER_GUARDS.get(task)
    if guard is not None and not guard(answer, entry):
        return 0.0
    try:
        value = float(make_dataset(task, config).score_answer(answer, entry))
    except Exception:  # the verifier choked on a malformed answer: the answer is wrong
        return 0.0
    return min(1.0, max(0.0, value))
