"""Run a program against a problem's test cases in the sandbox, one sandboxed process per test.

One process per test keeps tests independent (no state leaks, a per-test timeout) and lets the
host compare outputs: the program never sees the expected answers, so it cannot fake a pass.
Styles: "stdio" (input on stdin, compare stdout) and "function" (call `fn_name(*args)` through a
small harness; the JSON of the return value is compared on the host).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from pydantic import BaseModel, Field

from rlkit import sandbox

RESULT_MARK = "__rlkit_result__:"
HARNESS = """\
import json, sys
args = json.loads(sys.stdin.read())
namespace = {"__name__": "solution"}
exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
fn = namespace.get(FN_NAME)
if fn is None and isinstance(namespace.get("Solution"), type):
    fn = getattr(namespace["Solution"](), FN_NAME)
if fn is None:
    raise SystemExit(f"no function named {FN_NAME!r} in the solution")
result = fn(*args)
print()
print(MARK + json.dumps(result))
"""


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


def normalize_stdout(text: str) -> list[str]:
    """Lines without trailing whitespace and without trailing blank lines."""
    lines = [line.rstrip() for line in str(text).strip("\n").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


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


async def run_case(
    code: str, suite: TestSuite, case: TestCase, timeout: float, memory_mb: int
) -> bool:
    """True when the program passes this case; raises SandboxFailure on infrastructure failure."""
    if suite.style == "stdio":
        result = await sandbox.run(
            code, stdin=str(case.input), timeout=timeout, memory_mb=memory_mb
        )
    else:
        harness = f"FN_NAME = {suite.fn_name!r}\nMARK = {RESULT_MARK!r}\n" + HARNESS
        result = await sandbox.run(
            harness,
            stdin=json.dumps(case.input),
            files={"solution.py": code},
            timeout=timeout,
            memory_mb=memory_mb,
        )
    if result.status == "sandbox_error":
        raise SandboxFailure(f"sandbox failed: {result.stderr.strip()[-300:]}")
    if result.status != "ok":
        return False
    if suite.style == "stdio":
        return normalize_stdout(result.stdout) == normalize_stdout(str(case.output))
    lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if not lines:
        return False
    try:
        got = json.loads(lines[-1][len(RESULT_MARK) :])
    except json.JSONDecodeError:
        return False
    return values_equal(got, case.output)


async def run_tests(
    code: str, suite: TestSuite, *, timeout: float = 5.0, memory_mb: int = 512
) -> list[bool]:
    """Pass/fail per test case (run concurrently; the sandbox bounds parallelism)."""
    outcomes = await asyncio.gather(
        *(run_case(code, suite, case, timeout, memory_mb) for case in suite.cases),
        return_exceptions=True,  # let every run finish before reporting a failure
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [bool(outcome) for outcome in outcomes]
