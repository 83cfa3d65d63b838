"""The task factory: `python -m swe_env.make_tasks --repo inflection --count 40`.

For a shipped repository whose test suite passes, it runs the suite once in the sandbox (the
baseline), then tries AST mutants of its source functions in a deterministic order, running the
whole suite in the sandbox for each. A mutant is kept when at least one baseline-passing test now
fails and the failures stay local (at most `max_fail_fraction` of the suite, so import-time
breakage is rejected); FAIL_TO_PASS = baseline-passing tests that fail, PASS_TO_PASS = those still
passing. The issue text is written from the failing tests' names and pytest's output (no model).
Tasks of the repository replace its earlier ones in the output file; others are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from swe_env.mutate import Mutant, function_mutants, interleave
from swe_env.session import SessionLimits
from swe_env.tasks import DATA_DIR, DEFAULT_PROTECTED, REPOS_DIR, Task, load_tasks, write_tasks
from swe_env.testrun import run_tests

MAX_ISSUE_OUTPUT = 2500
# Per-process address space of suite runs: the same as an episode's (SessionLimits).
MEMORY_MB = SessionLimits().memory_mb


class RepoSpec(BaseModel):
    """A shipped repository: where its sources and tests are, and where it came from."""

    version: str = Field(description="the sdist version the tree was taken from")
    license: str = Field(description="SPDX licence id of the library")
    sources: list[str] = Field(description="globs of files to mutate")
    tests: list[str] = Field(description="test paths the suite runs")
    test_globs: list[str] = Field(description="protected test paths (fnmatch)")
    pythonpath: list[str] = Field(default_factory=lambda: ["."], description="import roots")


REPOS: dict[str, RepoSpec] = {
    "inflection": RepoSpec(
        version="0.5.1",
        license="MIT",
        sources=["inflection/__init__.py"],
        tests=["test_inflection.py"],
        test_globs=["test_*.py"],
    ),
    "parse": RepoSpec(
        version="1.20.2",
        license="MIT",
        sources=["parse.py"],
        tests=["tests"],
        test_globs=["tests/*"],
    ),
    "isodate": RepoSpec(
        version="0.7.2",
        license="BSD-3-Clause",
        sources=["src/isodate/*.py"],
        tests=["tests"],
        test_globs=["tests/*"],
        pythonpath=["src"],
    ),
    "toolz": RepoSpec(
        version="1.0.0",
        license="BSD-3-Clause",
        sources=["toolz/*.py", "toolz/curried/*.py", "toolz/sandbox/*.py"],
        tests=["toolz/tests"],
        test_globs=["toolz/tests/*"],
    ),
    "more-itertools": RepoSpec(
        version="10.5.0",
        license="MIT",
        sources=["more_itertools/more.py", "more_itertools/recipes.py"],
        tests=["tests"],
        test_globs=["tests/*"],
    ),
}


def unified_diff(relpath: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{relpath}",
            f"b/{relpath}",
        )
    )


def problem_statement(repo: str, failing: list[str], output: str) -> str:
    """Issue text from the failing tests and pytest's report of them."""
    start = output.find("= FAILURES =")
    if start < 0:
        start = output.find("= ERRORS =")
    end = output.find("short test summary info")
    report = output[start:end] if 0 <= start < end else output[-MAX_ISSUE_OUTPUT:]
    report = report[: MAX_ISSUE_OUTPUT - 200].strip()
    shown = "\n".join(f"- {name}" for name in failing[:10])
    more = f"\n- ... and {len(failing) - 10} more" if len(failing) > 10 else ""
    return (
        f"Some tests of `{repo}` fail after a recent change to the library.\n\n"
        f"Failing tests:\n{shown}{more}\n\n"
        f"Test output:\n```\n{report}\n```\n\n"
        "Find the bug in the library's source code and fix it so that these tests pass without "
        "breaking the others. Do not change the tests."
    )


def difficulty(n_fail: int, function_lines: int) -> str:
    """Easy: many failing tests point at a short function; hard: one test, a long function."""
    if n_fail >= 3 and function_lines <= 25:
        return "easy"
    if n_fail <= 2 and function_lines > 40:
        return "hard"
    return "medium"


class Factory:
    """Validates the mutants of one repository against its test suite in the sandbox."""

    def __init__(self, repo: str, timeout: float, max_fail_fraction: float) -> None:
        self.name, self.spec = repo, REPOS[repo]
        self.tree = REPOS_DIR / repo
        self.timeout = timeout
        self.max_fail_fraction = max_fail_fraction
        self.baseline: set[str] = set()

    async def check_baseline(self) -> None:
        # the factory's trees are its own (no agent code): no canary, so the output stays clean
        result, verdict = await run_tests(
            self.tree, self.spec.pythonpath, self.spec.tests, self.timeout, MEMORY_MB, canary=False
        )
        outcomes = verdict.outcomes
        self.baseline = {node for node, outcome in outcomes.items() if outcome == "PASSED"}
        if result.status != "ok" or not self.baseline:
            raise SystemExit(f"{self.name}: the unmodified test suite does not pass")

    def candidates(self, seed: int) -> list[tuple[str, Mutant]]:
        found = []
        for pattern in self.spec.sources:
            for path in sorted(self.tree.glob(pattern)):
                relpath = path.relative_to(self.tree).as_posix()
                found += [(relpath, m) for m in function_mutants(path.read_text())]
        by_key = {f"{rel}:{m.function}:{m.start}:{m.operator}": (rel, m) for rel, m in found}
        order = interleave([m for _, m in found], seed)
        rank = {id(m): i for i, m in enumerate(order)}
        return sorted(by_key.values(), key=lambda item: rank[id(item[1])])

    async def validate(self, relpath: str, mutant: Mutant, index: int) -> Task | None:
        original = (self.tree / relpath).read_text()
        buggy = mutant.apply(original)
        try:
            compile(buggy, relpath, "exec")
        except SyntaxError:
            return None
        with tempfile.TemporaryDirectory(prefix="swe-mutant-") as tmp:
            tree = Path(tmp) / "tree"
            shutil.copytree(self.tree, tree)
            (tree / relpath).write_text(buggy)
            result, verdict = await run_tests(
                tree, self.spec.pythonpath, self.spec.tests, self.timeout, MEMORY_MB, canary=False
            )
            outcomes = verdict.outcomes
        if result.status not in ("ok", "runtime_error"):
            return None  # timeouts, memory, output floods: not a clean bug
        failing = sorted(n for n in self.baseline if outcomes.get(n) != "PASSED")
        passing = sorted(self.baseline - set(failing))
        if not failing or len(failing) > self.max_fail_fraction * len(self.baseline):
            return None
        return Task(
            instance_id=f"{self.name}__mut-{index:04d}",
            repo=self.name,
            base=unified_diff(relpath, original, buggy),
            problem_statement=problem_statement(self.name, failing, result.stdout),
            patch=unified_diff(relpath, buggy, original),
            FAIL_TO_PASS=failing,
            PASS_TO_PASS=passing,
            protected_paths=[*DEFAULT_PROTECTED, *self.spec.test_globs],
            difficulty=difficulty(len(failing), mutant.function_lines),
            pythonpath=self.spec.pythonpath,
            metadata={
                "operator": mutant.operator,
                "file": relpath,
                "function": mutant.function,
                "line": mutant.start,
                "function_lines": mutant.function_lines,
                "n_fail": len(failing),
                "source": f"{self.name}=={self.spec.version} sdist",
            },
        )


async def make(
    repo: str, count: int, seed: int, jobs: int, timeout: float, max_fail_fraction: float
) -> tuple[list[Task], dict[str, float]]:
    """Up to `count` validated tasks for `repo`, and the factory's throughput figures."""
    factory = Factory(repo, timeout, max_fail_fraction)
    t0 = time.perf_counter()
    await factory.check_baseline()
    candidates = factory.candidates(seed)
    tasks: list[Task] = []
    tried = 0
    queue = iter(enumerate(candidates))
    lock = asyncio.Lock()

    async def worker() -> None:
        nonlocal tried
        while len(tasks) < count:
            async with lock:
                item = next(queue, None)
            if item is None:
                return
            index, (relpath, mutant) = item
            task = await factory.validate(relpath, mutant, index)
            tried += 1
            if task is not None and len(tasks) < count:
                tasks.append(task)
                print(
                    f"{task.instance_id}: {mutant.operator} in {relpath}:{mutant.start}", flush=True
                )

    await asyncio.gather(*(worker() for _ in range(jobs)))
    elapsed = time.perf_counter() - t0
    tasks.sort(key=lambda task: task.instance_id)
    stats = {
        "repo": repo,
        "candidates": len(candidates),
        "tried": tried,
        "validated": len(tasks),
        "seconds": round(elapsed, 1),
        "validated_per_minute": round(60 * len(tasks) / elapsed, 2),
        "tried_per_minute": round(60 * tried / elapsed, 2),
    }
    return tasks, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swe_env.make_tasks", description=__doc__)
    parser.add_argument("--repo", required=True, choices=sorted(REPOS))
    parser.add_argument("--count", type=int, default=40, help="validated tasks wanted")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="mutants validated concurrently")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per suite run")
    parser.add_argument("--max-fail-fraction", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=DATA_DIR / "tasks.jsonl.gz")
    args = parser.parse_args(argv)
    if args.count < 1 or args.jobs < 1:
        parser.error("--count and --jobs must be >= 1")
    tasks, stats = asyncio.run(
        make(args.repo, args.count, args.seed, args.jobs, args.timeout, args.max_fail_fraction)
    )
    kept = [t for t in load_tasks(args.out) if t.repo != args.repo] if args.out.exists() else []
    write_tasks(sorted([*kept, *tasks], key=lambda t: t.instance_id), args.out)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
