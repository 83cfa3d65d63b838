"""The code environment: extraction, grading, the offline set's references, loaders, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
from code_env import extract_code, grading, load_environment
from code_env.dataset import OFFLINE
from code_env.exploits import CODE_EXPLOITS, constant_program
from code_env.grading import earned_pass_rate, trivial_share

from rlkit import sandbox
from rlkit.envs import Rollout
from rlkit.envs.check import check_environment, check_environment_async, play, report_lines
from rlkit.errors import UsageError
from rlkit.sandbox import SandboxResult

PROBLEMS = [json.loads(line) for line in OFFLINE.read_text().splitlines()]


def _answer(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\nDone."


async def _score(env: Any, completions: list[str], problem_index: int = 0) -> list[Rollout]:
    row = env.dataset[problem_index]
    rollouts = []
    for text in completions:
        rollout = env.new_rollout(row)
        rollout.completion = [{"role": "assistant", "content": text}]
        rollouts.append(rollout)
    await env.score_group(rollouts)
    return rollouts


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "b = 2\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```\nprint(1)\n```", "print(1)\n"),
        ("```python\nfirst\n```\n```bash\nls\n```", "first\n"),
        ("<think>```python\nwrong\n```</think>```python\nright\n```", "right\n"),
        ("print('bare program')", "print('bare program')"),
        ("I do not know how to solve this.", None),
        ("", None),
        ("a " * 3000, None),  # the parser raises MemoryError on it: not code, not an error
    ],
)
def test_extract_code(text: str, code: str | None) -> None:
    assert extract_code(text) == code


def test_offline_set_shape() -> None:
    env = load_environment()
    assert env.env_id == "code" and len(env.dataset) == len(PROBLEMS) >= 20
    styles = {json.loads(p["tests"])["style"] for p in PROBLEMS}
    assert styles == {"stdio", "function"}
    assert all(len(json.loads(p["tests"])["cases"]) <= 15 for p in PROBLEMS)
    assert env.dataset[0]["prompt"][0]["role"] == "system"


@pytest.mark.system
def test_every_reference_solution_is_gold() -> None:
    """`rlkit env check code --gold`: each reference, played through the rollout, passes all
    tests in the sandbox; empty and garbage replies pass none."""
    report = check_environment(load_environment(), num_rows=len(PROBLEMS), gold=True)
    assert report.ok, report_lines(report)
    gold = [case for case in report.cases if case.kind == "gold"]
    assert len(gold) == len(PROBLEMS)
    full = {"pass_rate": 1.0, "all_passed": 1.0, "earned_pass_rate": 1.0}
    assert all(case.metrics == full for case in gold)


@pytest.mark.system
async def test_known_wrong_solutions_score_as_expected() -> None:
    env = load_environment()
    all_mode = load_environment(reward_mode="all")
    checked = 0
    for index, problem in enumerate(PROBLEMS):
        for wrong in problem["known_wrong"]:
            [soft] = await _score(env, [_answer(wrong["code"])], index)
            [hard] = await _score(all_mode, [_answer(wrong["code"])], index)
            # `reward` in the data is the raw fraction of tests passed (the pass_rate metric);
            # the default reward counts only the tests beyond what a constant program passes
            assert soft.metrics["pass_rate"] == pytest.approx(wrong["reward"]), problem["id"]
            suite = grading.TestSuite.model_validate_json(problem["tests"])
            baseline = trivial_share(suite)
            expected = max(0.0, (wrong["reward"] - baseline) / (1 - baseline))
            assert soft.reward == pytest.approx(expected), problem["id"]
            assert hard.reward == 0.0 and soft.error is None
            checked += 1
    assert checked >= 5


@pytest.mark.system
async def test_broken_programs_score_zero() -> None:
    env = load_environment(timeout=1.0)
    two_sum = 0
    cheats = [
        "No code here, sorry.",
        _answer("def two_sum(nums, target):\n    return [0, 1"),  # syntax error
        _answer("def two_sum(nums, target):\n    raise ValueError('nope')\n"),
        _answer("def two_sum(nums, target):\n    while True:\n        pass\n"),
        _answer("def other_name(nums, target):\n    return [0, 1]\n"),
        # An object equal to everything must not pass: results are compared as JSON on the host.
        _answer(
            "class Any:\n    def __eq__(self, other):\n        return True\n"
            "def two_sum(nums, target):\n    return Any()\n"
        ),
        # Killing the grading harness fails this test and every later one.
        _answer("import os\ndef two_sum(nums, target):\n    os.kill(os.getppid(), 9)\n"),
    ]
    rollouts = await _score(env, cheats, two_sum)
    assert [r.reward for r in rollouts] == [0.0] * len(cheats)
    assert all(r.error is None for r in rollouts)


A_PLUS_B = 12  # index of the stdio problem "a-plus-b" in the offline set


@pytest.mark.system
async def test_each_test_runs_in_a_fresh_normal_process(tmp_path: Path) -> None:
    env = load_environment(timeout=1.0)
    assert PROBLEMS[A_PLUS_B]["id"] == "a-plus-b"
    stdio_variants = [
        "import sys\ndata = sys.stdin.buffer.read().split()\nprint(int(data[0]) + int(data[1]))\n",
        "def main():\n    a, b = map(int, open(0).read().split())\n    print(a + b)\n\n"
        "if __name__ == '__main__':\n    main()\n",
        "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)\n",
        "import sys\na, b = map(int, input().split())\n"
        "print('debug', file=sys.stderr)\nprint(a + b)\n",
    ]
    rollouts = await _score(env, [_answer(code) for code in stdio_variants], A_PLUS_B)
    assert [r.reward for r in rollouts] == [1.0] * len(stdio_variants)

    # One input loops forever: only that test times out, the others still pass (2 of 3, one
    # more than a constant program passes: half of the reward above it).
    looping = "a, b = map(int, input().split())\nwhile a == 1:\n    pass\nprint(a + b)\n"
    [partial] = await _score(env, [_answer(looping)], A_PLUS_B)
    assert partial.metrics["pass_rate"] == pytest.approx(2 / 3)
    assert partial.reward == pytest.approx(1 / 2)

    # Global state does not leak from one test into the next.
    apps = tmp_path / "apps.jsonl"
    io = {"fn_name": "double", "inputs": [[1], [5], [0]], "outputs": [[2], [10], [0]]}
    apps.write_text(json.dumps({"question": "Double x.", "input_output": json.dumps(io)}) + "\n")
    stateful = "calls = []\ndef double(x):\n    calls.append(x)\n    return 2 * x * len(calls)\n"
    [isolated] = await _score(load_environment(dataset=str(apps)), [_answer(stateful)])
    assert isolated.reward == 1.0


async def test_sandbox_failure_marks_the_rollout_errored(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_run(code: str, **kwargs: Any) -> SandboxResult:
        return SandboxResult(status="sandbox_error", stderr="bwrap: cannot mount")

    monkeypatch.setattr(sandbox, "run", broken_run)
    env = load_environment()
    [rollout] = await _score(env, [_answer(PROBLEMS[0]["reference"])])
    assert rollout.reward == 0.0
    assert rollout.error is not None and "sandbox failed" in rollout.error


def test_loads_apps_style_jsonl_and_parquet(tmp_path: Path) -> None:
    apps = tmp_path / "apps.jsonl"
    rows = [
        {
            "question": "Add two numbers.",
            "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}),
        },
        {
            "question": "Double x.",
            "input_output": json.dumps(
                {"fn_name": "double", "inputs": [[1], [5]], "outputs": [[2], [10]]}
            ),
        },
    ]
    apps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = load_environment(dataset=str(apps))
    info = [json.loads(row["info"]["tests"]) for row in env.dataset]
    assert info[0]["style"] == "stdio" and info[0]["cases"][1] == {
        "input": "3 4\n",
        "output": "7\n",
    }
    assert info[1]["fn_name"] == "double" and info[1]["cases"][1]["output"] == 10
    assert [row["info"]["reference"] for row in env.dataset] == ["", ""]

    parquet = tmp_path / "problems.parquet"
    datasets.Dataset.from_list(PROBLEMS[:3]).to_parquet(str(parquet))
    env = load_environment(dataset=str(parquet), max_tests=2, num_examples=2)
    assert len(env.dataset) == 2
    assert all(len(json.loads(r["info"]["tests"])["cases"]) <= 2 for r in env.dataset)


@pytest.mark.system
async def test_apps_style_problem_is_graded(tmp_path: Path) -> None:
    apps = tmp_path / "apps.jsonl"
    io = {"fn_name": "double", "inputs": [[1], [5], [0]], "outputs": [[2], [10], [0]]}
    solutions = json.dumps(["def double(x):\n    return x + x\n"])
    problem = {"question": "Double x.", "input_output": json.dumps(io), "solutions": solutions}
    apps.write_text(json.dumps(problem) + "\n")
    env = load_environment(dataset=str(apps))
    assert (
        await check_environment_async(env, num_rows=1, gold=True)
    ).ok  # APPS' first solution is the gold
    good, half = await _score(
        env,
        [_answer("def double(x):\n    return 2 * x\n"), _answer("def double(x):\n    return 2\n")],
    )
    # `return 2` passes one test of three, as a constant: no reward
    assert good.reward == 1.0 and half.reward == 0.0
    assert half.metrics["pass_rate"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward_mode": "most"}, "reward_mode"),
        ({"max_tests": 0}, "max_tests"),
        ({"dataset": "/nonexistent/problems.jsonl"}, "could not load dataset"),
        ({"dataset": "no-such-owner/no-such-code-dataset"}, "could not load dataset"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_environment(**kwargs)


IS_PRIME = 17  # stdio, answers YES on 3 of its 5 tests


def _suite(
    style: str, cases: list[tuple[Any, Any]], fn_name: str | None = None
) -> grading.TestSuite:
    return grading.TestSuite.model_validate(
        {"style": style, "fn_name": fn_name, "cases": [{"input": i, "output": o} for i, o in cases]}
    )


def test_trivial_share_is_the_best_constant_or_echo_program() -> None:
    yes_no = _suite(
        "stdio", [("2\n", "YES\n"), ("4", "NO"), ("7", "YES "), ("9", "NO"), ("3", "YES")]
    )
    assert trivial_share(yes_no) == pytest.approx(3 / 5)  # print('YES'), whitespace normalised
    echo = _suite("stdio", [("1 2 3\n", "1 2 3"), ("3 1", "1 3"), ("5", "5"), ("", "0")])
    assert trivial_share(echo) == pytest.approx(2 / 4)  # printing stdin back passes two
    function = _suite(
        "function",
        [([[1, 2], 0], [1, 2]), ([[3], 1], 1.0000000001), ([[1], 1], 1), ([[], 2], [])],
        "f",
    )
    assert trivial_share(function) == pytest.approx(2 / 4)  # `return 1` or `return args[0]`
    distinct = _suite("stdio", [("1", "2"), ("2", "4"), ("3", "6")])
    assert trivial_share(distinct) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("passed", "baseline", "reward"),
    [
        ([True] * 5, 0.6, 1.0),
        ([True, True, True, False, False], 0.6, 0.0),  # what print('YES') passes
        ([True, True, True, True, False], 0.6, 0.5),
        ([False] * 5, 0.6, 0.0),
        ([True, False, False], 1 / 3, 0.0),
        ([True, True, False], 1 / 3, 0.5),
        ([True, True], 1.0, 1.0),  # every test has one output: only all-pass pays (as a constant)
        ([True, False], 1.0, 0.0),
    ],
)
def test_earned_pass_rate_pays_only_above_the_trivial_share(
    passed: list[bool], baseline: float, reward: float
) -> None:
    assert earned_pass_rate(passed, baseline) == pytest.approx(reward)


@pytest.mark.system
async def test_constant_echo_and_silent_programs_earn_nothing() -> None:
    """Issue 61: print('YES') earned 0.6 on is-prime under the raw fraction; every constant, the
    echo of stdin and a silent program now earn 0 on every shipped problem, in both modes."""
    assert PROBLEMS[IS_PRIME]["id"] == "is-prime"
    env = load_environment(timeout=2.0)
    row = env.dataset[IS_PRIME]
    [yes] = await _score(env, [_answer(constant_program(row, "YES"))], IS_PRIME)
    assert yes.metrics["pass_rate"] == pytest.approx(3 / 5) and yes.reward == 0.0
    [exploit] = [e for e in CODE_EXPLOITS if e.name == "constant output"]
    for index in range(len(PROBLEMS)):
        row = env.dataset[index]
        variants = exploit.variants(env, row)
        assert {"YES", "NO", "0", "-1", "echo input", "print nothing"} <= set(variants)
        for name, script in variants.items():
            rollout, _ = await play(env, row, script)
            assert rollout.error is None
            assert rollout.reward == 0.0, (PROBLEMS[index]["id"], name, rollout.metrics)
            assert exploit.detect is not None and exploit.detect(rollout), name


@pytest.mark.system
async def test_harness_exploits_earn_nothing() -> None:
    """Early exits, killing the harness, forged result records and hunting the tests on disk
    (they never enter the sandbox) pass no test, on a function and a stdio problem."""
    env = load_environment(timeout=2.0)
    exploits = [e for e in CODE_EXPLOITS if e.name in ("early exit", "harness tampering")]
    assert len(exploits) == 2
    for index in (0, A_PLUS_B, IS_PRIME):
        row = env.dataset[index]
        for exploit in exploits:
            for name, script in exploit.variants(env, row).items():
                rollout, _ = await play(env, row, script)
                assert rollout.error is None, (name, rollout.error)
                assert rollout.metrics["pass_rate"] == 0.0, (PROBLEMS[index]["id"], name)
                assert rollout.reward == 0.0
                assert exploit.detect is not None and exploit.detect(rollout), name


def test_detectors_leave_real_solutions_alone() -> None:
    env = load_environment()
    for index, problem in enumerate(PROBLEMS):
        rollout = Rollout(
            prompt=env.dataset[index]["prompt"],
            completion=[{"role": "assistant", "content": _answer(problem["reference"])}],
            info=env.dataset[index]["info"],
        )
        flagged = [e.name for e in CODE_EXPLOITS if e.detect and e.detect(rollout)]
        assert not flagged, (problem["id"], flagged)


def test_load_environment_registers_the_code_exploits() -> None:
    names = {e.name for e in load_environment().exploits}
    assert {"early exit", "harness tampering", "constant output"} <= names
    assert all(e.family == "code" for e in CODE_EXPLOITS)


async def test_the_sandbox_service_default_profile_runs_every_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 66: `rlkit sandbox serve` with its default profile refused problems that ask for
    more than 30 s (n tests x (timeout + 0.5 s) + 5 s): every shipped problem's ask fits it."""
    from rlkit.sandbox.service import ServiceSettings

    asked: list[tuple[float, int]] = []

    async def record(code: str, **kwargs: Any) -> SandboxResult:
        asked.append((kwargs["timeout"], kwargs["memory_mb"]))
        return SandboxResult(status="ok")

    monkeypatch.setattr(sandbox, "run", record)
    env = load_environment()
    for index in range(len(env.dataset)):
        await _score(env, [_answer(PROBLEMS[0]["reference"])], problem_index=index)
    (profile,) = ServiceSettings().profiles
    assert len(asked) == len(env.dataset) and max(asked) > (30.0, 0)  # the old default's limit
    assert all(profile.covers(timeout, memory) for timeout, memory in asked), max(asked)
    # what the environment declares up front (the sandbox preflight) is what its rollouts ask
    (ask,) = env.sandbox_asks()
    assert (ask.timeout, ask.memory_mb) == max(asked)
