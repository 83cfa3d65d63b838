"""logic: determinism, disjoint splits, the frozen eval set, answer extraction for every task,
multi-answer verifiers, unsafe answers, arguments, and `rlkit eval logic` on the fake server."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from logic_env import extract_answer, load_environment
from logic_env.freeze import EVAL_FILE, EVAL_NAMESPACE, MANIFEST_FILE
from logic_env.rows import generate_rows
from logic_env.tasks import LEVEL_NAMES, TASKS, score

from rlkit.envs import load_environment as load_by_id
from rlkit.envs.check import check_environment, report_lines
from rlkit.errors import UsageError
from tests.helpers.cli import only_run_dir, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer

FROZEN = [json.loads(line) for line in EVAL_FILE.read_text().splitlines()]
FIRST = {row["info"]["task"]: row for row in reversed(FROZEN) if row["info"]["level"] == "easy"}


def reward(row: dict[str, Any], text: str) -> float:
    info = row["info"]
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    return score(info["task"], info["config"], answer, json.loads(info["entry"]))


def test_at_least_twelve_tasks_across_puzzle_types() -> None:
    assert len(TASKS) >= 12
    categories = {category for category, _ in TASKS.values()}
    assert {"constraint grid", "deduction", "arithmetic search", "sequence"} <= categories
    assert "symbolic logic" in categories
    assert all(set(levels) == set(LEVEL_NAMES) for _, levels in TASKS.values())


def test_training_rows_are_deterministic_per_seed() -> None:
    args = {"tasks": ["mini_sudoku", "countdown", "knights_knaves"], "num_train_examples": 24}
    first = load_environment(**args, seed=3).get_dataset()
    again = load_environment(**args, seed=3).get_dataset()
    other = load_environment(**args, seed=4).get_dataset()
    assert first["question"] == again["question"] and first["answer"] == again["answer"]
    assert len(first) == 24 and set(first["question"]) != set(other["question"])
    tasks = [info["task"] for info in first["info"]]
    assert sorted(set(tasks)) == ["countdown", "knights_knaves", "mini_sudoku"]
    assert all(tasks.count(t) == 8 for t in set(tasks))


def test_train_and_eval_never_overlap() -> None:
    # Small puzzle spaces repeat often: the easy propositional and 4-queens generators
    # produce the eval questions again within a few hundred draws.
    env = load_environment(
        tasks=["propositional_logic", "n_queens", "mini_sudoku"],
        difficulty="easy",
        num_train_examples=300,
    )
    train = set(env.get_dataset()["question"])
    evaluation = set(env.get_eval_dataset()["question"])
    assert len(evaluation) == 30 and not train & evaluation


def test_frozen_eval_set_covers_every_task_and_level_and_is_reproducible() -> None:
    manifest = json.loads(MANIFEST_FILE.read_text())
    assert manifest["reasoning_gym_version"] == importlib.metadata.version("reasoning-gym")
    assert manifest["levels"] == {task: levels for task, (_, levels) in TASKS.items()}
    per_level = manifest["rows_per_level"]
    combos = [(t, lv) for t in TASKS for lv in LEVEL_NAMES]
    assert len(FROZEN) == per_level * len(combos)
    # Interleaved: the first rows cover every task at every level.
    assert [(r["info"]["task"], r["info"]["level"]) for r in FROZEN[: len(combos)]] == combos
    assert len({r["question"] for r in FROZEN}) == len(FROZEN)
    for task, level in [("sudoku", "hard"), ("zebra_puzzles", "easy"), ("graph_color", "medium")]:
        regenerated = generate_rows(task, level, 2, EVAL_NAMESPACE, distinct=True)
        frozen = [r for r in FROZEN if (r["info"]["task"], r["info"]["level"]) == (task, level)]
        assert regenerated == frozen[:2]


def test_eval_selection_by_task_level_and_count() -> None:
    env = load_environment(
        tasks="sudoku,countdown", difficulty=["hard"], num_eval_examples=3, num_train_examples=0
    )
    rows = env.get_eval_dataset()
    assert [(i["task"], i["level"]) for i in rows["info"]] == [
        ("sudoku", "hard"),
        ("countdown", "hard"),
    ] * 3
    assert env.dataset is None and rows[0]["prompt"][0]["role"] == "system"


@pytest.mark.parametrize("eval_examples", [0, 2])
def test_training_rows_are_generated_once(
    eval_examples: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logic_env

    calls: list[int] = []
    generate = logic_env.LogicEnv._generate
    monkeypatch.setattr(
        logic_env.LogicEnv, "_generate", lambda self: calls.append(1) or generate(self)
    )
    env = load_environment(tasks="countdown", num_eval_examples=eval_examples, num_train_examples=5)
    assert len(calls) == (0 if eval_examples else 1)  # deferred when there are eval rows
    assert len(env.get_dataset()) == 5 and len(env.get_dataset()) == 5
    assert len(calls) == 1 and env.dataset[0]["prompt"][0]["role"] == "system"


@pytest.mark.parametrize("task", list(TASKS))
def test_answer_extraction(task: str) -> None:
    row = FIRST[task]
    gold = row["answer"]
    assert reward(row, f"<answer>{gold}</answer>") == 1.0
    assert reward(row, f"Let me reason.\nStep 1...\n<answer>\n{gold}\n</answer>\n") == 1.0
    quoted = f"<think>maybe <answer>nonsense</answer>? no.</think>\n<answer>{gold}</answer>"
    assert reward(row, quoted) == 1.0
    assert reward(row, f"<answer>wrong</answer> on reflection <answer>{gold}</answer>") == 1.0
    assert reward(row, gold) == 0.0  # the bare answer, no tags
    assert reward(row, f"<answer>{gold}") == 0.0  # never closed
    assert reward(row, f"<think>I think <answer>{gold}</answer> but") == 0.0  # still thinking
    assert reward(row, "") == 0.0


def test_format_metric_and_info_through_the_rubric() -> None:
    env = load_environment(tasks=["knights_knaves"], num_eval_examples=1, num_train_examples=0)
    report = check_environment(env, num_rows=3, gold=True)
    assert report.ok, report_lines(report)
    gold = next(c for c in report.cases if c.kind == "gold")
    assert gold.metrics == {"correct_answer": 1.0, "answer_format": 1.0}
    assert gold.info["task"] == "knights_knaves" and gold.info["category"] == "deduction"
    empty = next(c for c in report.cases if c.kind == "empty")
    assert empty.metrics == {"correct_answer": 0.0, "answer_format": 0.0}


def _arithmetic_alternative(numbers: list[int], target: int, gold: str) -> str:
    """Another expression over exactly `numbers` that makes `target` (brute force)."""
    for perm in itertools.permutations(numbers):  # eval below sees only our digits and + - *
        for ops in itertools.product("+-*", repeat=len(numbers) - 1):
            expr = str(perm[0]) + "".join(f" {op} {n}" for op, n in zip(ops, perm[1:], strict=True))
            if eval(expr) == target and expr.replace(" ", "") != gold.replace(" ", ""):
                return expr
    raise AssertionError(f"no alternative for {numbers} -> {target}")


def _alternatives(task: str) -> tuple[dict[str, Any], str]:
    """A row of a multi-answer task and a valid answer that differs from its gold answer."""
    for row in FROZEN:
        if row["info"]["task"] != task:
            continue
        meta = json.loads(row["info"]["entry"])["metadata"]
        gold = row["answer"]
        try:
            if task == "graph_color":  # swap two colours
                swap = {1: 2, 2: 1}
                return row, json.dumps({v: swap.get(c, c) for v, c in json.loads(gold).items()})
            if task == "countdown":
                return row, _arithmetic_alternative(meta["numbers"], meta["target"], gold)
            if task == "puzzle24":
                return row, _arithmetic_alternative(meta["numbers"], 24, gold)
            if task == "n_queens" and len(meta["valid_answers"]) > 1:
                return row, next(a for a in meta["valid_answers"] if a != gold)
            if task == "propositional_logic":  # the gold conclusion and another, derived
                other = next(
                    f"({gold} ∧ {literal})"
                    for v in meta["variables"]
                    for literal in (v, f"¬{v}")
                    if literal != gold and reward(row, f"<answer>{literal}</answer>") == 1.0
                )
                return row, other
            if task == "knights_knaves":  # the same assignment, clauses in another order
                clauses = gold.rstrip(".").replace(", and ", ", ").split(", ")
                return row, ", and ".join(reversed(clauses)) + "."
        except (AssertionError, StopIteration):
            continue
    raise AssertionError(f"no frozen {task} row with an alternative answer")


@pytest.mark.parametrize(
    "task",
    ["graph_color", "countdown", "puzzle24", "n_queens", "propositional_logic", "knights_knaves"],
)
def test_multi_answer_tasks_accept_a_valid_non_gold_answer(task: str) -> None:
    row, alternative = _alternatives(task)
    assert alternative != row["answer"]
    assert reward(row, f"<answer>{alternative}</answer>") == 1.0


def test_partial_credit_is_kept() -> None:
    """mini_sudoku: a grid with some blanks filled right and the rest left open earns part of
    the reward (only blanks count: see test_logic_exploits)."""
    row = FIRST["mini_sudoku"]
    meta = json.loads(row["info"]["entry"])["metadata"]
    blanks = [(i, j) for i, line in enumerate(meta["puzzle"]) for j, v in enumerate(line) if not v]
    grid = [[str(v) for v in line] for line in meta["solution"]]
    i, j = blanks[0]
    grid[i][j] = "_"
    partial = "\n".join(" ".join(line) for line in grid)
    assert 0.0 < reward(row, f"<answer>{partial}</answer>") < 1.0


def test_unsafe_answers_are_never_evaluated(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    for task in ("countdown", "puzzle24", "n_queens"):
        assert reward(FIRST[task], f"<answer>{payload}</answer>") == 0.0
    assert not marker.exists()
    assert reward(FIRST["countdown"], "<answer>9**9**9**9**9</answer>") == 0.0
    deep = "(" * 5000 + "P" + ")" * 5000
    assert reward(FIRST["propositional_logic"], f"<answer>{deep}</answer>") == 0.0
    assert reward(FIRST["propositional_logic"], "<answer>◇◆◇</answer>") == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tasks": ["sudoku", "chess"]}, "unknown logic task"),
        ({"difficulty": "impossible"}, "difficulty must be"),
        ({"weights": {"sudoku": -1.0}}, "weights must be >= 0"),
        ({"tasks": ["sudoku"], "weights": {"countdown": 2.0}}, "weights must be >= 0"),
        ({"num_train_examples": -5}, "num_train_examples must be >= 0"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_by_id("logic", **kwargs)


def test_weights_share_the_training_rows() -> None:
    env = load_environment(
        tasks=["mini_sudoku", "survo"],
        weights={"mini_sudoku": 3.0, "survo": 1.0},
        difficulty="easy,hard",
        num_train_examples=40,
    )
    counts: dict[tuple[str, str], int] = {}
    for info in env.get_dataset()["info"]:
        counts[(info["task"], info["level"])] = counts.get((info["task"], info["level"]), 0) + 1
    assert counts == {
        ("mini_sudoku", "easy"): 15,
        ("mini_sudoku", "hard"): 15,
        ("survo", "easy"): 5,
        ("survo", "hard"): 5,
    }


def test_rlkit_eval_reports_reward_per_task(monkeypatch, capsys, tmp_path: Path) -> None:
    """The fake model answers sudoku correctly, countdown without tags, knights_knaves wrongly."""
    answers = {row["question"]: row for row in FROZEN}

    def responder(body: dict[str, Any]) -> str:
        row = answers[body["messages"][-1]["content"]]
        task = row["info"]["task"]
        if task == "sudoku":
            return f"Filling the blanks.\n<answer>\n{row['answer']}\n</answer>"
        if task == "countdown":
            return row["answer"]
        return "<answer>Nobody is a knight</answer>"

    args = json.dumps({"tasks": ["sudoku", "countdown", "knights_knaves"], "num_eval_examples": 2})
    with FakeOpenAIServer(responder=responder) as server:
        code, out = run_cli(
            monkeypatch, capsys, "eval", "logic", "-m", "fake-model", "-b", server.url, "-a", args,
            "-n", "18", "-r", "2", "-o", str(tmp_path),
        )  # fmt: skip
    assert code == 0, out
    assert "reward task=sudoku" in out
    summary = json.loads((only_run_dir(tmp_path) / "metadata.json").read_text())["summary"]
    assert summary["errors"] == 0 and summary["num_rollouts"] == 36
    assert summary["reward_by"]["task"] == {
        "countdown": 0.0,
        "knights_knaves": 0.0,
        "sudoku": 1.0,
    }
    assert set(summary["reward_by"]["level"]) == {"easy", "medium", "hard"}
    assert summary["metrics"]["answer_format"] == pytest.approx(2 / 3)
