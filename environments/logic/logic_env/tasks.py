"""The curated reasoning-gym tasks, their difficulty levels and their (guarded) verifiers.

Each task maps `easy` / `medium` / `hard` to keyword arguments of its reasoning-gym generator
config (board sizes, blanks, people, terms...). Scoring calls the task's own `score_answer`, so
tasks with many valid answers (graph colouring, countdown, n-queens, cryptarithms) accept any
valid one. Three verifiers evaluate the answer text as Python (`sympy.parse_expr` in countdown
and puzzle24, `eval` in n_queens); their answers are checked against what the task asks for
before the verifier sees them, and anything else scores 0. A verifier that raises on a malformed
answer (e.g. RecursionError on thousands of parentheses) also scores 0: the answer is wrong, not
the environment.

No credit for what the prompt already states, nor for what a constant earns (issue 61):

- propositional_logic (`conclusion_score`): 1.0 for a *derived* conclusion, else 0. A conclusion
  C is derived when the premises entail it (truth tables over the puzzle's variables, as
  reasoning-gym does), it is not a tautology, and it is not a restatement: no single premise
  entails it (a premise, its equivalent, its weakening `premise ∨ X`), it is not equivalent to
  the conjunction of any set of premises, a conjunction is derived only if one of its conjuncts
  is, and a disjunction (`∨`, `→`, `¬(A ∧ B)`) one of whose disjuncts follows from the premises
  is only that disjunct weakened (state the disjunct). `P → Q, P ⊢ Q` is derived; `P ∧ Q`,
  `P ∨ R`, `P ↔ Q` from atoms `P`, `Q` are not, nor `Q ∨ R` from `P → Q, P`. Premises usually
  fix each variable's value, so a guessed literal (`Q` or `¬Q`) is a two-way guess: rows are
  balanced so `Q` is a derived conclusion as often as `¬Q`. Rows whose premises allow no
  derived conclusion among simple candidates (literals, two literals joined) are not generated
  (`answer_class`), and the gold answer is the first derived candidate.
- sudoku, mini_sudoku, futoshiki (`blank_score`): the oracle's exact grid earns 1.0; otherwise a
  complete grid (cells `1`-`9`, or `_` for a blank left open) earns 0.9 x correctly filled blanks
  / blanks, provided every given cell is kept and no filled blank is wrong (else 0). Givens earn
  nothing, and a constant fill is wrong somewhere unless it is the solution.
- knights_knaves, circuit_logic, number_sequence, countdown, puzzle24, cryptarithm, graph_color
  (`ALL_OR_NOTHING`): 1.0 for a correct answer, else 0, so one role for everyone (0.3 + 0.7 x
  matches before), a number containing the answer (paid by length) and the verifiers' format
  consolations (0.01 / 0.05 for parseable text or the prompt's numbers) earn nothing.
- Answer splits (`answer_class`, used by `rows.generate_rows`): a task whose answer is one of a
  few options has its rows drawn so that no option takes more than its share (circuit 0/1 one
  half, each knights-and-knaves assignment 1/2^n, each zebra name 1/3, each family relation 1/6,
  each number-sequence answer and shortest path 1/20, `Q` or `¬Q` as derived conclusion one half);
  shortest-path grids without a path ('infeasible': half the generator's grids) and graphs a
  fixed colouring solves are not drawn.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import operator
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.logic.propositional_logic import Expression, Operator

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
            # complexity 1 premises are bare variables: nothing to derive from them
            "easy": {
                "min_vars": 2,
                "max_vars": 2,
                "min_statements": 2,
                "max_statements": 3,
                "min_complexity": 2,
                "max_complexity": 2,
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
        conclusion = derived_conclusion(entry)
        if conclusion is None:
            raise ValueError("propositional_logic: the premises allow no derived conclusion")
        return conclusion
    raise ValueError(f"task {task!r}: the entry has no answer")


# --- propositional logic: derived conclusions only -----------------------------------------


def _truth_mask(expr: Expression, variables: list[str]) -> int:
    """Bit i set when `expr` holds under assignment i of `variables` (truth table)."""
    mask = 0
    for i in range(2 ** len(variables)):
        assignment = {v: bool((i >> k) & 1) for k, v in enumerate(variables)}
        if expr.evaluate(assignment):
            mask |= 1 << i
    return mask


def _negate(expr: Expression) -> Expression:
    return Expression(Operator.NOT, expr)


def _conjuncts(expr: Expression) -> list[Expression]:
    """Top-level conjuncts, negations pushed in (`¬(A ∨ B)`, `¬(A → B)`, `A ↔ B`)."""
    op, left, right = expr.operator, expr.left, expr.right
    if op == Operator.AND:
        return _conjuncts(left) + _conjuncts(right)
    if op == Operator.IFF:
        return [
            Expression(Operator.IMPLIES, left, right),
            Expression(Operator.IMPLIES, right, left),
        ]
    if op == Operator.NOT and isinstance(left, Expression):
        inner = left
        if inner.operator == Operator.NOT:
            return _conjuncts(inner.left)
        if inner.operator == Operator.OR:
            return _conjuncts(_negate(inner.left)) + _conjuncts(_negate(inner.right))
        if inner.operator == Operator.IMPLIES:
            return _conjuncts(inner.left) + _conjuncts(_negate(inner.right))
    return [expr]


def _disjuncts(expr: Expression) -> list[Expression]:
    """Top-level disjuncts, negations pushed in (`A → B` is `¬A ∨ B`, `¬(A ∧ B)`)."""
    op, left, right = expr.operator, expr.left, expr.right
    if op == Operator.OR:
        return _disjuncts(left) + _disjuncts(right)
    if op == Operator.IMPLIES:
        return _disjuncts(_negate(left)) + _disjuncts(right)
    if op == Operator.NOT and isinstance(left, Expression):
        inner = left
        if inner.operator == Operator.NOT:
            return _disjuncts(inner.left)
        if inner.operator == Operator.AND:
            return _disjuncts(_negate(inner.left)) + _disjuncts(_negate(inner.right))
    return [expr]


class _Premises:
    """Truth tables of a puzzle's premises and of every conjunction of them."""

    def __init__(self, entry: dict[str, Any]) -> None:
        meta = entry["metadata"]
        self.variables = sorted(meta["variables"])
        self.full = (1 << 2 ** len(self.variables)) - 1
        self.masks = [self.mask(Expression.from_string(p)) for p in meta["premises"]]
        self.entailed_by_all = self.full
        for m in self.masks:
            self.entailed_by_all &= m
        self.conjunctions = set()
        for size in range(1, len(self.masks) + 1):
            for subset in itertools.combinations(self.masks, size):
                self.conjunctions.add(functools.reduce(operator.and_, subset))

    def mask(self, expr: Expression) -> int:
        return _truth_mask(expr, self.variables)

    def entails(self, mask: int) -> bool:
        return self.entailed_by_all & ~mask == 0

    def restates(self, mask: int) -> bool:
        return (
            mask == self.full
            or mask in self.conjunctions
            or any(p & ~mask == 0 for p in self.masks)
        )

    def derived(self, expr: Expression) -> bool:
        """An entailed `expr` that is more than a restatement (see the module docstring)."""
        if self.restates(self.mask(expr)):
            return False
        conjuncts = _conjuncts(expr)
        if len(conjuncts) > 1:
            return any(self.derived(c) for c in conjuncts)
        disjuncts = _disjuncts(expr)
        if len(disjuncts) > 1:  # a disjunction with a disjunct that follows is its weakening
            return not any(self.entails(self.mask(d)) for d in disjuncts)
        return True


def conclusion_score(answer: str, entry: dict[str, Any]) -> float:
    """propositional_logic: 1.0 for an entailed, derived conclusion, else 0."""
    variables = set(entry["metadata"]["variables"])
    if any(v not in variables for v in re.findall(r"[A-Z]", answer)):
        return 0.0
    premises = _Premises(entry)
    expr = Expression.from_string(answer)
    mask = premises.mask(expr)  # raises on an unknown atom: the caller scores 0
    return float(premises.entails(mask) and premises.derived(expr))


def _candidates(variables: list[str]) -> list[str]:
    literals = [*variables, *(f"¬{v}" for v in variables)]
    binary = [
        f"({a} {op} {b})"
        for op in ("∨", "→", "∧", "↔")
        for a, b in itertools.permutations(literals, 2)
        if a.lstrip("¬") != b.lstrip("¬")
    ]
    return literals + binary


def derived_conclusion(entry: dict[str, Any]) -> str | None:
    """The generator's example conclusion if derived, else the first derived simple candidate
    (literals, then two literals joined by ∨ → ∧ ↔); None when there is none."""
    meta = entry["metadata"]
    for text in [str(meta.get("example_answer", "")), *_candidates(sorted(meta["variables"]))]:
        try:
            if text and conclusion_score(text, entry) == 1.0:
                return text
        except (ValueError, KeyError, AttributeError, RecursionError):
            continue
    return None


# --- grid puzzles: credit for the blanks only ----------------------------------------------

GRID_CELLS = "123456789_"


def blank_score(answer: str, entry: dict[str, Any]) -> float:
    """sudoku / mini_sudoku / futoshiki: see the module docstring."""
    oracle = str(entry["answer"])
    if _rstripped(answer) == _rstripped(oracle):
        return 1.0
    meta = entry["metadata"]
    solution, puzzle = meta["solution"], meta["puzzle"]
    size = len(solution)
    grid = []
    for line in answer.split("\n"):
        cells = [c for c in line if c in GRID_CELLS]
        if len(cells) == size:  # like reasoning-gym: lines without a row of cells are ignored
            grid.append(cells)
        if len(grid) == size:
            break
    if len(grid) < size:
        return 0.0
    blanks = correct = 0
    for i in range(size):
        for j in range(size):
            cell, want = grid[i][j], str(solution[i][j])
            if puzzle[i][j] != 0:  # a given: must be kept
                if cell != want:
                    return 0.0
                continue
            blanks += 1
            if cell == want:
                correct += 1
            elif cell != "_":  # a wrong digit in a blank
                return 0.0
    credit = 0.9 * correct / blanks if blanks else 0.0
    if len(answer) > len(oracle):  # reasoning-gym's penalty for extra length
        credit *= len(oracle) / len(answer)
    return credit


def _rstripped(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


OWN_SCORERS: dict[str, Callable[[str, dict[str, Any]], float]] = {
    "propositional_logic": conclusion_score,
    "sudoku": blank_score,
    "mini_sudoku": blank_score,
    "futoshiki": blank_score,
}
ALL_OR_NOTHING = frozenset(
    {
        "knights_knaves",
        "circuit_logic",
        "number_sequence",
        "countdown",
        "puzzle24",
        "cryptarithm",
        "graph_color",
    }
)


# --- answer splits: no option takes more than its share ------------------------------------


def _graph(entry: dict[str, Any]) -> dict[str, Any]:
    puzzle = entry["metadata"]["puzzle"]
    return ast.literal_eval(puzzle) if isinstance(puzzle, str) else puzzle


def fixed_colourings(entry: dict[str, Any]) -> list[dict[str, int]]:
    """Colourings that need no search: one colour, and colours 1, 2, 3 in vertex order."""
    vertices = _graph(entry)["vertices"]
    return [
        {str(v): 1 for v in vertices},
        {str(v): i % 3 + 1 for i, v in enumerate(vertices)},
    ]


def _proper(entry: dict[str, Any], colouring: dict[str, int]) -> bool:
    return all(colouring[str(a)] != colouring[str(b)] for a, b in _graph(entry)["edges"])


def answer_class(task: str, entry: dict[str, Any]) -> list[tuple[str, str, float]] | None:
    """The options a row's answer takes, as (group, option, largest share of the group's rows);
    None: the row is not drawn at all (`rows.generate_rows` keeps every prefix within shares)."""
    meta = entry["metadata"]
    answer = str(entry.get("answer"))
    if task == "circuit_logic":
        return [("", answer, 0.5)]
    if task == "knights_knaves":
        solution = meta["solution"]
        return [("", "".join("T" if s else "F" for s in solution), 0.5 ** len(solution))]
    if task == "zebra_puzzles":
        return [("", answer, 1 / meta["difficulty"]["num_people"])]
    if task == "family_relationships":
        return [("", answer, 1 / 6)]
    if task == "number_sequence":
        return [("", answer, 0.05)]
    if task == "shortest_path":
        return None if answer.strip() == "infeasible" else [("", answer, 0.05)]
    if task == "propositional_logic":  # a guessed literal is a two-way guess: balance each sign
        if derived_conclusion(entry) is None:
            return None
        classes = []
        for v in sorted(meta["variables"]):
            for literal in (v, f"¬{v}"):
                if conclusion_score(literal, entry) == 1.0:
                    classes.append((v, literal, 0.5))
        return classes
    if task == "graph_color":
        return None if any(_proper(entry, c) for c in fixed_colourings(entry)) else []
    return []


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
    """propositional_logic: an 'answer' with no variable at all is no conclusion."""
    return any(var in answer for var in entry["metadata"]["variables"])


ANSWER_GUARDS: dict[str, Callable[[str, dict[str, Any]], bool]] = {
    "countdown": _arithmetic_only,
    "puzzle24": _arithmetic_only,
    "n_queens": _queens_safe,
    "propositional_logic": _names_a_variable,
}


def score(task: str, config: str, answer: str, entry: dict[str, Any]) -> float:
    """The task's verifier (built with the row's generator config) on an extracted answer:
    rlkit's own for propositional logic and the blank-counting grids, reasoning-gym's for the
    rest (all or nothing for `ALL_OR_NOTHING`); see the module docstring."""
    guard = ANSWER_GUARDS.get(task)
    if guard is not None and not guard(answer, entry):
        return 0.0
    own = OWN_SCORERS.get(task)
    try:
        if own is not None:
            value = float(own(answer, entry))
        else:
            value = float(make_dataset(task, config).score_answer(answer, entry))
    except Exception:  # the verifier choked on a malformed answer: the answer is wrong
        return 0.0
    if task in ALL_OR_NOTHING:
        return 1.0 if value >= 1.0 else 0.0
    return min(1.0, max(0.0, value))
