"""The `code` environment: single-turn Python problems graded by tests run in rlkit.sandbox.

`load_environment("code", dataset="offline" | "path.jsonl" | "hf/name", reward_mode="fraction" |
"all", ...)`. A sandbox infrastructure failure marks the rollout errored (kept out of training).
The module is `code_env` because `code` is a standard-library module.

Reward. `"all"`: 1 when every test passes, else 0. `"fraction"` (default): a soft reward, as Klear
found better for learning, but one that counts only work the program did. The raw fraction of
tests passed pays programs that ignore the problem: print('YES') passes 3 of is-prime's 5 tests
(0.6), and on any problem the most common expected output earns its share (issue 61). So the
default pays the fraction above what the best trivial program passes on that problem's tests,
computed from the tests themselves (`grading.trivial_share`: the most common expected output's
share, or the echo of the input's, whichever is larger), rescaled:
`max(0, (fraction - trivial) / (1 - trivial))`, 1.0 only when every test passes. A constant, an
echo or a silent program therefore earns 0 on every problem, and gold still earns 1. Chosen over
switching the default to all-pass because it keeps the dense signal on partially right programs.
A problem whose tests all expect one output (trivial share 1) cannot tell a constant from a
solution; `load_problems` logs it. The raw fraction is kept as the `pass_rate` metric.
"""

from __future__ import annotations

from typing import Any

from code_env.dataset import load_problems
from code_env.exploits import CODE_EXPLOITS
from code_env.extract import extract_code
from code_env.grading import (
    SandboxFailure,
    TestSuite,
    earned_pass_rate,
    run_tests,
    suite_timeout,
    trivial_share,
)
from rlkit import sandbox
from rlkit.envs import Rubric, SingleTurnEnv
from rlkit.envs.parsers import last_assistant_text
from rlkit.errors import UsageError
from rlkit.sandbox.preflight import SandboxAsk

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Think briefly, then give your complete solution as a "
    "single ```python code block."
)
REWARD_MODES = ("fraction", "all")

__all__ = [
    "CodeEnv",
    "SandboxFailure",
    "extract_code",
    "load_environment",
    "load_problems",
    "run_tests",
]


class CodeEnv(SingleTurnEnv):
    """Single-turn code problems; the gold completion is the row's reference solution."""

    test_timeout: float = 5.0
    memory_mb: int = 512

    def sandbox_asks(self) -> list[SandboxAsk]:
        """The largest sandbox request of a rollout: one run of a problem's whole test suite
        (checked against a sandbox service's limits before a run starts)."""
        cases = max(
            (
                len(TestSuite.model_validate_json(row["info"]["tests"]).cases)
                for split in (self.dataset, self.eval_dataset)
                if split is not None
                for row in split
            ),
            default=0,
        )
        if not cases:
            return []
        return [
            SandboxAsk(
                f"a problem's {cases} tests in one run, {self.test_timeout:g} s each",
                suite_timeout(cases, self.test_timeout),
                self.memory_mb,
            )
        ]

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        reference = (row.get("info") or {}).get("reference")
        if not reference:
            return None
        return [{"role": "assistant", "content": f"```python\n{reference.rstrip()}\n```"}]


def load_environment(
    dataset: str = "offline",
    split: str = "train",
    reward_mode: str = "fraction",
    max_tests: int = 15,
    timeout: float = 5.0,
    memory_mb: int = 512,
    num_examples: int = -1,
    system_prompt: str = SYSTEM_PROMPT,
) -> CodeEnv:
    """Build the environment; `timeout` and `memory_mb` apply to each test's sandboxed run."""
    sandbox.require()  # no isolation: refuse now, with the fix, not per rollout
    if reward_mode not in REWARD_MODES:
        raise UsageError(f"code environment: reward_mode must be one of {REWARD_MODES}")
    if max_tests < 1:
        raise UsageError("code environment: max_tests must be >= 1")
    problems = load_problems(dataset, split, max_tests)
    if num_examples > 0:
        problems = problems.select(range(min(num_examples, len(problems))))

    async def test_results(completion: Any, info: dict[str, Any], state: dict[str, Any]) -> list:
        """Pass/fail per test, computed once per rollout (both reward functions read it)."""
        if "test_results" not in state:
            code = extract_code(last_assistant_text(completion))
            suite = TestSuite.model_validate_json(info["tests"])
            if code is None:
                state["test_results"] = [False] * len(suite.cases)
            else:
                state["test_results"] = await run_tests(
                    code, suite, timeout=timeout, memory_mb=memory_mb
                )
        return state["test_results"]

    async def pass_rate(completion: Any, info: dict[str, Any], state: dict[str, Any]) -> float:
        """The raw fraction of tests passed (a metric: a constant program earns some of it)."""
        results = await test_results(completion, info, state)
        return sum(results) / len(results)

    async def all_passed(completion: Any, info: dict[str, Any], state: dict[str, Any]) -> float:
        return float(all(await test_results(completion, info, state)))

    async def earned_pass_rate_fn(
        completion: Any, info: dict[str, Any], state: dict[str, Any]
    ) -> float:
        """The fraction of tests passed beyond what a constant or echo program passes."""
        baseline = trivial_share(TestSuite.model_validate_json(info["tests"]))
        return earned_pass_rate(await test_results(completion, info, state), baseline)

    earned_pass_rate_fn.__name__ = "earned_pass_rate"
    weights = [0.0, 0.0, 1.0] if reward_mode == "fraction" else [0.0, 1.0, 0.0]
    env = CodeEnv(
        dataset=problems,
        system_prompt=system_prompt,
        rubric=Rubric(funcs=[pass_rate, all_passed, earned_pass_rate_fn], weights=weights),
        env_id="code",
    )
    env.test_timeout, env.memory_mb = timeout, memory_mb
    env.exploits.extend(CODE_EXPLOITS)
    return env
