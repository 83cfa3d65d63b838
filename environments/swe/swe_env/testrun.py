"""Run a repository's pytest tests in the sandbox and read each test's outcome.

The command runs with `python3 -S` (no `site`, so no sitecustomize or .pth file planted in the
repository runs), plugin autoloading off (no entry point planted as a dist-info), no cache and
no bytecode; pytest comes from the read-only runtime tree. Outcomes come from `-rA`'s summary
lines (`PASSED node`, `FAILED node - msg`, `ERROR node`): one line per test, stable across pytest
versions.
"""

from __future__ import annotations

import functools
import posixpath
import re
import shlex
from pathlib import Path

from rlkit import sandbox
from rlkit.sandbox.launch import Mounts
from rlkit.sandbox.result import SandboxResult
from rlkit.sandbox.runtime import runtime_tree
from rlkit.sandbox.workspace import writable_copy

OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S.*?)(?:\s+-\s+.*)?$")
PYTEST = "python3 -S -B -m pytest -p no:cacheprovider -q -rA --tb=short --color=no"


def repo_prelude(pythonpath: list[str]) -> list[str]:
    """Shell lines every sandboxed command starts with: in the repository, its import roots in
    front of the runtime tree, no bytecode written, a fixed hash seed."""
    roots = ":".join(shlex.quote(posixpath.normpath(f"/sandbox/{p}")) for p in pythonpath)
    return [
        "cd /sandbox",
        f'export PYTHONPATH={roots}:"$PYTHONPATH"',
        "export PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0",
    ]


def pytest_script(pythonpath: list[str], targets: list[str]) -> str:
    """The bash program that runs pytest on `targets` inside the repository."""
    return "\n".join(
        [
            *repo_prelude(pythonpath),
            "export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
            f"{PYTEST} {' '.join(shlex.quote(t) for t in targets)} 2>&1",
        ]
    )


def parse_outcomes(output: str) -> dict[str, str]:
    """node id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL / XPASS."""
    outcomes: dict[str, str] = {}
    for line in output.splitlines():
        match = OUTCOME.match(line.rstrip())
        if match and "::" in match.group(2):
            outcomes[match.group(2)] = match.group(1)
    return outcomes


class SandboxFailure(RuntimeError):
    """The sandbox itself failed: the rollout is errored (kept out of training), not scored 0."""


@functools.cache
def pytest_runtime() -> Path:
    """The read-only tree with pytest and its requirements that sandboxed runs import."""
    return runtime_tree("pytest")


def mounts(repo: Path) -> Mounts:
    """The repository copy read-write at /sandbox, the pytest runtime read-only."""
    return Mounts(workdir=repo, pythonpath=(pytest_runtime(),))


async def run_tests(
    tree: Path, pythonpath: list[str], targets: list[str], timeout: float, memory_mb: int
) -> tuple[SandboxResult, dict[str, str]]:
    """Run pytest on `targets` in a sandboxed copy of `tree`; the result and each test's outcome.

    Raises SandboxFailure when the sandbox (not the tests) failed.
    """
    with writable_copy(tree) as repo:
        result = await sandbox.run(
            pytest_script(pythonpath, targets),
            language="bash",
            timeout=timeout,
            memory_mb=memory_mb,
            mounts=mounts(repo),
        )
    if result.status == "sandbox_error":
        raise SandboxFailure(f"test sandbox failed: {result.stderr.strip()[-300:]}")
    return result, parse_outcomes(result.stdout)
