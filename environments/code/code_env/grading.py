"""Grade a program against a problem's test cases: one sandbox run per problem.

`harness.py` runs inside the sandbox and forks one child per test (no shared state, a timeout per
test); the interpreter starts once per problem, much faster than one sandboxed process per
test (bench_sandbox.py; figures in rlkit's docs/benchmarks.md). The host keeps the expected
outputs and compares: a program cannot see them, so it cannot fake a pass. Styles: "stdio"
(stdin in, stdout compared after normalisation) and "function" (`fn_name(*args)`; the JSON of the
return value compared, floats within 1e-6).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from code_env.harness import digest, normalize_stdout
from rlkit import sandbox

HARNESS = (Path(__file__).parent / "harness.py").read_text()


class TestCase(BaseModel):
    """`input`: stdin text (stdio) or the argument list (function); `output`: expected."""

    input: Any
    output: Any


class TestSuite(BaseModel):
    style: str = Field(pattern="^(stdio|function)$")
    fn_name: str | None = None
    cases: list[TestCase]


class SandboxFailure(RuntimeError):
    """The sandbox itself failed: the rollout must be marked errored, not scored 0."""


def values_equal(got: Any, expected: Any) -> bool:
    """JSON values equal, floats within 1e-6 (relative or absolute)."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected
    if isinstance(got, int | float) and isinstance(expected, int | float):
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(values_equal, got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_equal(got[k], expected[k]) for k in got)
    return got == expected


def _passed(record: dict[str, Any], suite: TestSuite, case: TestCase) -> bool:
    if record.get("status") != "ok":
        return False
    if suite.style == "stdio":
        return record.get("digest") == digest(str(case.output))
    try:
        return values_equal(json.loads(record.get("result") or ""), case.output)
    except json.JSONDecodeError:
        return False


def _shares(expected: list[Any], produced: list[Any], same: Any) -> float:
    """The share of cases where a program's output (`produced[i]`) equals `expected[i]`."""
    return sum(map(same, produced, expected)) / len(expected)


def constant_share(suite: TestSuite) -> float:
    """The fraction of the tests the best constant program passes: the one that always prints
    (or returns) the suite's most common expected output."""
    if not suite.cases:
        return 0.0
    outputs = [c.output for c in suite.cases]
    if suite.style == "stdio":
        texts = [normalize_stdout(str(o)) for o in outputs]
        return max(texts.count(t) for t in texts) / len(texts)
    return max(sum(values_equal(c, o) for o in outputs) for c in outputs) / len(outputs)


def echo_share(suite: TestSuite) -> float:
    """The fraction of the tests an echo passes: stdin printed back (stdio), or one argument
    returned unchanged (function; the best argument position)."""
    if not suite.cases:
        return 0.0
    if suite.style == "stdio":
        same = lambda i, o: normalize_stdout(str(i)) == normalize_stdout(str(o))  # noqa: E731
        return _shares([c.output for c in suite.cases], [c.input for c in suite.cases], same)
    arity = max((len(c.input) for c in suite.cases if isinstance(c.input, list)), default=0)
    best = 0.0
    for k in range(arity):
        args = [
            c.input[k] if isinstance(c.input, list) and k < len(c.input) else None
            for c in suite.cases
        ]
        best = max(best, _shares([c.output for c in suite.cases], args, values_equal))
    return best


def trivial_share(suite: TestSuite) -> float:
    """What a program that ignores the problem earns under the raw fraction: the best of a
    constant output and an echo of the input (`constant_share`, `echo_share`)."""
    return max(constant_share(suite), echo_share(suite))


def earned_pass_rate(passed: list[bool], baseline: float) -> float:
    """The share of the tests passed beyond `baseline` (`trivial_share`), rescaled to [0, 1]:
    max(0, (fraction - baseline) / (1 - baseline)); 1.0 only when every test passes, 0 for
    anything a constant or an echo program reaches."""
    if not passed:
        return 0.0
    if all(passed):
        return 1.0
    if baseline >= 1.0:
        return 0.0
    fraction = sum(passed) / len(passed)
    return max(0.0, (fraction - baseline) / (1.0 - baseline))


def suite_timeout(cases: int, timeout: float) -> float:
    """The sandbox timeout of one run of `cases` tests of `timeout` s each (the harness's own
    start and each test's slack included)."""
    return cases * (timeout + 0.5) + 5.0


async def run_tests(
    code: str, suite: TestSuite, *, timeout: float = 5.0, memory_mb: int = 512
) -> list[bool]:
    """Pass/fail per test case; raises SandboxFailure when the sandbox itself failed."""
    job = {
        "style": suite.style,
        "fn_name": suite.fn_name,
        "inputs": [str(c.input) if suite.style == "stdio" else c.input for c in suite.cases],
        "timeout": timeout,
    }
    result = await sandbox.run(
        HARNESS,
        stdin=json.dumps(job),
        files={"solution.py": code},
        timeout=suite_timeout(len(suite.cases), timeout),
        memory_mb=memory_mb,
    )
    if result.status == "sandbox_error":
        raise SandboxFailure(f"sandbox failed: {result.stderr.strip()[-300:]}")
    records: dict[int, dict[str, Any]] = {}
    for line in result.stdout.splitlines():
        try:
            record = json.loads(line)
            records.setdefault(int(record["index"]), record)
        except (ValueError, KeyError, TypeError):
            continue  # a line the harness did not write (or a cut-off one): ignore it
    # Tests without a record never finished (the program killed the harness): they failed.
    return [_passed(records.get(i, {}), suite, case) for i, case in enumerate(suite.cases)]
