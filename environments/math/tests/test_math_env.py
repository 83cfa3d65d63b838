"""math: equivalence checks in worker processes, timeouts, shipped data, rollouts, judge."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from math_env import SHIPPED, load_rows
from math_env.verify import MathVerifier

from rlkit.envs import load_environment
from rlkit.envs.check import check_environment, report_lines
from rlkit.errors import UsageError
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer


@pytest.fixture(scope="module")
def verifier() -> Iterator[MathVerifier]:
    verifier = MathVerifier(workers=2, timeout=3.0)
    yield verifier
    verifier.close()


@pytest.mark.parametrize(
    ("gold", "predicted", "expected"),
    [
        (r"\frac{1}{2}", "0.5", True),
        ("(x+1)^2", "x^2+2x+1", True),
        ("70", "70", True),
        (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi/2)", True),
        ("70", "71", False),
        ("(x+1)^2", "x^2+1", False),
        (r"\frac{1}{2}", r"\frac{1}{3}", False),
    ],
)
async def test_equivalence(
    verifier: MathVerifier, gold: str, predicted: str, expected: bool
) -> None:
    assert await verifier.verify(gold, predicted) is expected


async def test_pathological_input_times_out_and_scores_zero() -> None:
    verifier = MathVerifier(workers=1, timeout=2.0)
    try:
        assert await verifier.verify("1", "1")  # warm up the worker (spawn + imports)
        start = time.monotonic()
        assert await verifier.verify("1", "9^{9^{9^{9^{9}}}}") is False
        assert time.monotonic() - start < 10
        # the hung worker was killed and replaced: the pool still answers
        assert await asyncio.wait_for(verifier.verify("2", "2"), timeout=30)
    finally:
        verifier.close()


def test_shipped_datasets_load_offline() -> None:
    sizes = {name: len(load_rows(name)) for name in SHIPPED}
    assert sizes == {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "gsm8k": 1319}
    gsm8k = load_rows("gsm8k", num_examples=1)[0]
    assert gsm8k["answer"] == "18" and gsm8k["difficulty"] is None
    assert load_rows("amc23", num_examples=1)[0]["answer"] == "27"
    math500 = load_rows("math500", num_examples=1)[0]
    assert math500["difficulty"] == 2.0 and math500["info"]["subject"] == "Precalculus"
    env = load_environment("math", dataset="aime25")
    assert env.env_id == "math" and env.dataset is None and len(env.get_eval_dataset()) == 30
    assert "difficulty" in env.get_eval_dataset().column_names
    assert env.get_eval_dataset()[0]["prompt"][0]["content"].endswith(r"\boxed{}.")


def test_local_file_with_boxed_solutions(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [
        {"problem": "1+1?", "solution": r"It is \boxed{2}.", "difficulty": "Level 3"},
        {"question": "2+2?", "answer": 4},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = load_environment("math", dataset=str(path))
    data = env.get_dataset()
    assert data["answer"] == ["2", "4"] and data["difficulty"] == [3.0, None]
    parquet = tmp_path / "train.parquet"
    load_rows(str(path)).to_parquet(str(parquet))
    assert load_environment("math", dataset=str(parquet)).get_dataset()["answer"] == ["2", "4"]
    with pytest.raises(UsageError, match="could not load dataset 'no-such-set'"):
        load_environment("math", dataset="no-such-set")
    with pytest.raises(UsageError, match="judge_base_url and judge_model"):
        load_environment("math", dataset=str(path), judge_model="judge")


def _write_problems(tmp_path: Path) -> str:
    path = tmp_path / "problems.jsonl"
    lines = [
        {"question": "What is 1/2?", "answer": r"\frac{1}{2}"},
        {"question": "Name the answer.", "answer": "x"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return str(path)


def reply_by_question(body: dict) -> str:
    if "1/2" in body["messages"][-1]["content"]:
        return r"<think>\boxed{7}</think> Half is \boxed{0.5}"
    return r"<think> the thinking never ended, so no answer: \boxed{x}"


async def test_rollouts_are_scored_by_math_verify(tmp_path: Path) -> None:
    env = load_environment("math", dataset=_write_problems(tmp_path), verify_workers=1)
    try:
        with FakeOpenAIServer(responder=reply_by_question) as server:
            async with InferenceClient(server.url) as client:
                right = await env.run_group(env.get_dataset()[0], client, "fake-model", {}, n=2)
                (unboxed,) = await env.run_group(
                    env.get_dataset()[1], client, "fake-model", {}, n=1
                )
    finally:
        env.verifier.close()
    assert [r.reward for r in right] == [1.0, 1.0]
    assert right[0].metrics == {"correct_answer": 1.0, "boxed_answer": 1.0}
    assert unboxed.metrics == {"correct_answer": 0.0, "boxed_answer": 0.0}


async def test_llm_judge_rescues_answers_the_rule_rejects(tmp_path: Path) -> None:
    def judge(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        return "<think>same value</think>Yes" if "one half" in prompt else "no"

    def student(body: dict) -> str:
        return r"\boxed{one half}" if "1/2" in body["messages"][-1]["content"] else r"\boxed{y}"

    with FakeOpenAIServer(responder=judge, models=["judge"]) as judge_server:
        env = load_environment(
            "math",
            dataset=_write_problems(tmp_path),
            judge_base_url=judge_server.url,
            judge_model="judge",
            verify_workers=1,
        )
        try:
            with FakeOpenAIServer(responder=student) as server:
                async with InferenceClient(server.url) as client:
                    (rescued,) = await env.run_group(env.get_dataset()[0], client, "m", {}, n=1)
                    (wrong,) = await env.run_group(env.get_dataset()[1], client, "m", {}, n=1)
        finally:
            env.verifier.close()
        assert len(judge_server.requests) == 2 and judge_server.requests[0]["model"] == "judge"
    assert rescued.reward == 1.0 and wrong.reward == 0.0


def test_judge_key_variable_must_be_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RLKIT_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(UsageError, match="RLKIT_TEST_JUDGE_KEY is not set"):
        load_environment(
            "math",
            dataset=_write_problems(tmp_path),
            judge_base_url="http://127.0.0.1:9/v1",
            judge_model="j",
            judge_api_key_var="RLKIT_TEST_JUDGE_KEY",
        )


@pytest.mark.parametrize("dataset", sorted(SHIPPED))
def test_boxed_reference_answers_are_gold(dataset: str) -> None:
    """`rlkit env check math --gold` on each shipped set: math-verify accepts every reference
    against itself, and empty or garbage replies score 0."""
    env = load_environment("math", dataset=dataset, num_examples=40)
    try:
        report = check_environment(env, num_rows=40, gold=True)
    finally:
        env.verifier.close()
    assert report.ok, report_lines(report)


async def test_boxing_the_question_scores_zero() -> None:
    """Issue 61's audit: math-verify evaluates what it is given, so boxing the question itself
    ("Evaluate $(1+2i)6-3i$.", "Simplify $\\sqrt{242}$.") or its expression scored 1, and so did
    a whole question whose last number is the answer. Now 0; the answer itself still scores 1."""
    from math_env import copies_question

    from rlkit.envs.check import play
    from rlkit.envs.exploits import reply

    env = load_environment("math", num_examples=40, verify_workers=1)
    try:
        rows = {int(row["example_id"]): row for row in env.get_eval_dataset()}
        cases = {12: None, 20: "(1+2i)6-3i", 31: "\\sqrt{242}"}
        for index, expression in cases.items():
            row = rows[index]
            question = row["prompt"][-1]["content"]
            for text in filter(None, (question, expression, " ".join([question] * 20))):
                assert copies_question(question, text, row["answer"])
                rollout, _ = await play(env, row, reply(f"\\boxed{{{text}}}"))
                assert rollout.reward == 0.0, (index, text)
            gold, _ = await play(env, row, env.gold_completion(row))
            assert gold.reward == 1.0
    finally:
        env.verifier.close()


def test_copies_question_leaves_answers_alone() -> None:
    from math_env import copies_question

    for dataset in SHIPPED:
        for row in load_rows(dataset):
            assert not copies_question(row["question"], row["answer"], row["answer"])
    question = "Which is larger, $\\sqrt{2}$ or $1.4$?"
    assert not copies_question(question, "\\sqrt{2}", "\\sqrt2")  # the gold is in it too
    assert not copies_question("What is 2+2?", "4", "4")


async def test_math_exploits_earn_nothing() -> None:
    from math_env.exploits import MATH_EXPLOITS

    from rlkit.envs.check import play

    env = load_environment("math", num_examples=40, verify_workers=2)
    assert {e.name for e in MATH_EXPLOITS} <= {e.name for e in env.exploits}
    try:
        for row in list(env.get_eval_dataset())[:40]:
            gold, _ = await play(env, row, env.gold_completion(row))
            assert not [e.name for e in MATH_EXPLOITS if e.detect and e.detect(gold)]
            for exploit in MATH_EXPLOITS:
                for name, script in exploit.variants(env, row).items():
                    rollout, _ = await play(env, row, script)
                    assert rollout.error is None
                    assert rollout.reward == 0.0, (row["example_id"], exploit.name, name)
    finally:
        env.verifier.close()
