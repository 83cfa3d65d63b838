"""The `code` environment: single-turn Python problems graded by tests run in rlkit.sandbox.

`load_environment("code", dataset="offline" | "path.jsonl" | "hf/name", reward_mode="fraction" |
"all", ...)`. Reward is the fraction of tests passed (soft reward, as Klear found better) or 1/0
for all-pass; a sandbox infrastructure failure marks the rollout errored (kept out of training).
The module is `code_env` because `code` is a standard-library module.
"""

from __future__ import annotations

from typing import Any

from code_env.dataset import load_problems
from code_env.extract import extract_code
from code_env.grading import SandboxFailure, TestSuite, run_tests
from rlkit import sandbox
from rlkit.envs import Rubric, SingleTurnEnv
from rlkit.envs.parsers import last_assistant_text
from rlkit.errors import UsageError

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
        results = await test_results(completion, info, state)
        return sum(results) / len(results)

    async def all_passed(completion: Any, info: dict[str, Any], state: dict[str, Any]) -> float:
        return float(all(await test_results(completion, info, state)))

    weights = [1.0, 0.0] if reward_mode == "fraction" else [0.0, 1.0]
    return CodeEnv(
        dataset=problems,
        system_prompt=system_prompt,
        rubric=Rubric(funcs=[pass_rate, all_passed], weights=weights),
        env_id="code",
    )
