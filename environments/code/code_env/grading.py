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

from code_env.harness import digest
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
        timeout=len(suite.cases) * (timeout + 0.5) + 5.0,
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
