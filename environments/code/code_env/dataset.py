"""Problem sets for the code environment: the shipped offline set, local JSONL/parquet files or
Hugging Face datasets (read by `rlkit.envs.data.load_dataset_any`), normalised to rows with
`question`, `answer` and `info["tests"]`.

Accepted row shapes: rlkit's own (`question`, `tests` = {"style", "fn_name", "cases": [{"input",
"output"}]}) and the APPS/TACO one (`question`, `input_output` = JSON {"inputs", "outputs",
"fn_name"?}, where function outputs are wrapped in a one-element list).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from datasets import Dataset

from code_env.grading import TestCase, TestSuite, trivial_share
from rlkit.envs.data import load_dataset_any
from rlkit.errors import UsageError

logger = logging.getLogger(__name__)
OFFLINE = Path(__file__).parent / "data" / "problems.jsonl"
IO_HINTS = {
    "stdio": "Your program reads standard input and writes the answer to standard output.",
    "function": "Define the function `{fn_name}`; the tests call it with their arguments.",
}


def _suite_from_row(row: dict[str, Any]) -> TestSuite:
    if row.get("tests"):
        tests = row["tests"]
        return TestSuite.model_validate(json.loads(tests) if isinstance(tests, str) else tests)
    if row.get("input_output"):
        io = row["input_output"]
        io = json.loads(io) if isinstance(io, str) else io
        fn_name = io.get("fn_name")
        outputs = io["outputs"]
        if fn_name:
            outputs = [o[0] if isinstance(o, list) and len(o) == 1 else o for o in outputs]
        cases = [TestCase(input=i, output=o) for i, o in zip(io["inputs"], outputs, strict=True)]
        return TestSuite(style="function" if fn_name else "stdio", fn_name=fn_name, cases=cases)
    raise ValueError("row has neither `tests` nor `input_output`")


def _reference(row: dict[str, Any]) -> str:
    """A known-correct program: rlkit's `reference`, else APPS/TACO's first `solutions` entry."""
    if row.get("reference"):
        return str(row["reference"])
    solutions = row.get("solutions")
    if isinstance(solutions, str):
        try:
            solutions = json.loads(solutions)
        except json.JSONDecodeError:
            return ""
    return str(solutions[0]) if isinstance(solutions, list) and solutions else ""


def load_problems(source: str = "offline", split: str = "train", max_tests: int = 15) -> Dataset:
    """Rows: `question` (+ I/O hint), `answer` (""), `info` {tests (JSON), style, id, reference}."""
    rows = []
    raw = load_dataset_any(str(OFFLINE) if source == "offline" else source, split)
    for index, row in enumerate(raw):
        try:
            suite = _suite_from_row(row)
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"code environment: problem {index} of {source}: {exc}") from exc
        suite.cases = suite.cases[:max_tests]
        if trivial_share(suite) >= 1.0:
            logger.warning(
                "code problem %s: a constant or echo program passes every test; the reward "
                "cannot tell it from a solution",
                row.get("id", index),
            )
        question = str(row.get("question") or row.get("problem") or "")
        hint = IO_HINTS[suite.style].format(fn_name=suite.fn_name)
        problem_id = str(row.get("id", index))
        rows.append(
            {
                "question": f"{question.strip()}\n\n{hint}",
                "answer": "",
                "info": {
                    "tests": suite.model_dump_json(),
                    "style": suite.style,
                    "id": problem_id,
                    "reference": _reference(row),
                },
                "example_id": index,
            }
        )
    if not rows:
        raise UsageError(f"code environment: dataset {source!r} has no problems")
    return Dataset.from_list(rows)
