"""math: competition and grade-school math with boxed final answers.

The env id is `math`; the module is `math_env` because `math` is the standard library's (rlkit's
loader tries `<name>_env` when `<name>` is not an environment). The model's final answer is the
last `\\boxed{}` after `<think>` content is stripped; it is checked against the reference with
math-verify in worker processes with a hard timeout (see `verify.py`), and, when a judge is
configured, answers the rule marks wrong are re-checked by an LLM judge (see `judge.py`).

`dataset` is one of the shipped evaluation sets (`math500`, `aime24`, `aime25`, `amc23`,
`gsm8k`; offline copies with provenance in `data/README.md`), a local JSONL/JSON/parquet/CSV
file, a dataset folder or a hub name. Rows need `question` or `problem`, and `answer` (a GSM8K
`#### N` line is reduced to N) or a `solution` with a boxed answer. `difficulty` comes from a
`difficulty` or `level` column when there is one, else None, for later filtering.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from datasets import Dataset

from math_env.exploits import MATH_EXPLOITS
from math_env.judge import equivalent
from math_env.verify import MathVerifier
from rlkit.envs import SingleTurnEnv, ThinkParser, extract_boxed_answer
from rlkit.envs.data import load_dataset_any
from rlkit.envs.judge import judge_from_args
from rlkit.envs.rubric import Rubric

DATA_DIR = Path(__file__).parent / "data"
SHIPPED = {
    "math500": "math500.jsonl",
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "gsm8k": "gsm8k_test.jsonl",
}
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def _reference_answer(row: dict[str, Any]) -> str:
    answer = row.get("answer")
    if answer is None:
        boxed = extract_boxed_answer(str(row.get("solution") or ""))
        if boxed is None:
            raise ValueError("row has neither an 'answer' nor a boxed answer in 'solution'")
        return boxed
    text = str(answer).strip()
    if "####" in text:  # GSM8K: worked solution, then "#### 18"
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    if re.fullmatch(r"-?\d+\.0+", text):  # AMC 23 stores integers as floats
        text = text.split(".")[0]
    return text


def _difficulty(row: dict[str, Any]) -> float | None:
    value = row.get("difficulty", row.get("level"))
    if value is None:
        return None
    match = re.search(r"-?\d+(\.\d+)?", str(value))  # "Level 5" or 5
    return float(match.group()) if match else None


def load_rows(dataset: str, split: str = "train", num_examples: int = -1) -> Dataset:
    """Normalised rows: question, answer, difficulty, info (source, subject, original id)."""
    source = (
        load_dataset_any(str(DATA_DIR / SHIPPED[dataset]))
        if dataset in SHIPPED
        else load_dataset_any(dataset, split=split)
    )
    if num_examples > 0:
        source = source.select(range(min(num_examples, len(source))))
    rows = []
    for i, row in enumerate(source):
        question = row.get("question") or row.get("problem")
        if not question:
            raise ValueError(f"dataset {dataset!r} row {i} has no 'question' or 'problem'")
        rows.append(
            {
                "question": str(question),
                "answer": _reference_answer(row),
                "difficulty": _difficulty(row),
                "info": {
                    "source": dataset,
                    "subject": str(row.get("subject") or ""),
                    "id": str(row.get("unique_id") or row.get("id") or row.get("idx") or i),
                },
            }
        )
    return Dataset.from_list(rows)


_LATEX_NOISE = re.compile(r"\\left|\\right|\\[,;!]|\\displaystyle|[$\s{}]")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")  # prose words, not \\commands


def _squash(text: str) -> str:
    return _LATEX_NOISE.sub("", text).rstrip(".").lower()


def copies_question(question: str, predicted: str, gold: str) -> bool:
    """Whether the boxed answer is the question handed back instead of an answer (issue 61's
    audit: math-verify evaluates what it is given, so boxing the question of "Evaluate
    $(1+2i)6-3i$." or "Simplify $\\sqrt{242}$." scored 1, and boxing a whole question scores
    its last number). True when the answer holds four consecutive words of the question, or is
    an expression (not a bare number) copied from the question while the gold answer is not in
    it (a question of fewer than four words: all of them). Never true of the gold answer."""
    if _squash(predicted) == _squash(gold):
        return False
    words = [w.lower() for w in _WORD.findall(question)]
    said = f" {' '.join(w.lower() for w in _WORD.findall(predicted))} "
    run = min(4, len(words))  # a short question ("Simplify $x$."): all of its words
    if run and any(
        f" {' '.join(words[i : i + run])} " in said for i in range(len(words) - run + 1)
    ):
        return True
    copied, squashed = _squash(predicted), _squash(question)
    is_number = re.fullmatch(r"-?[\d.,]+", copied) is not None
    return bool(copied) and not is_number and copied in squashed and _squash(gold) not in squashed


class MathEnv(SingleTurnEnv):
    """Single-turn math; the gold completion boxes the reference answer."""

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        answer = row.get("answer")
        if not answer:
            return None
        return [{"role": "assistant", "content": f"The final answer is \\boxed{{{answer}}}."}]


def load_environment(
    dataset: str = "math500",
    dataset_split: str = "train",
    num_examples: int = -1,
    system_prompt: str = SYSTEM_PROMPT,
    verify_timeout: float = 5.0,
    verify_workers: int = 2,
    judge_base_url: str | None = None,
    judge_model: str | None = None,
    judge_api_key_var: str | None = None,
) -> MathEnv:
    """Shipped sets are evaluation-only (`eval_dataset`); other sources are the training set."""
    judge = judge_from_args(judge_base_url, judge_model, judge_api_key_var)
    rows = load_rows(dataset, dataset_split, num_examples)
    parser = ThinkParser(extract_fn=extract_boxed_answer)
    verifier = MathVerifier(workers=verify_workers, timeout=verify_timeout)

    async def correct_answer(
        prompt: list[dict[str, Any]], completion: list[dict[str, Any]], answer: str
    ) -> float:
        predicted = parser.parse_answer(completion)
        if not predicted or copies_question(prompt[-1]["content"], predicted, answer):
            return 0.0
        if await verifier.verify(answer, predicted):
            return 1.0
        if judge is not None:
            return float(await equivalent(judge, prompt[-1]["content"], answer, predicted))
        return 0.0

    def boxed_answer(completion: list[dict[str, Any]]) -> float:
        """Format metric (weight 0): did the reply end its reasoning with a boxed answer?"""
        return float(bool(parser.parse_answer(completion)))

    shipped = dataset in SHIPPED
    env = MathEnv(
        dataset=None if shipped else rows,
        eval_dataset=rows if shipped else None,
        system_prompt=system_prompt,
        parser=parser,
        rubric=Rubric([correct_answer, boxed_answer], [1.0, 0.0], parser=parser),
        sampling_defaults={"temperature": 1.0, "max_tokens": 2048},
        env_id="math",
    )
    env.verifier = verifier  # type: ignore[attr-defined]  # tests and callers may close it
    env.exploits.extend(MATH_EXPLOITS)
    return env
