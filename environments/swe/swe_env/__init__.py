"""The `swe` environment: fix procedurally injected bugs in real Python repositories, offline.

`load_environment("swe", tasks="shipped" | "path/to/tasks.jsonl[.gz]", repos=[...], ...)`. Each
rollout gets a writable copy of the buggy tree in the bubblewrap sandbox and the tools `bash`,
`view`, `str_replace` and `submit`; reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test
passes (SWE-bench's "resolved"), else 0; changed protected files (tests, packaging and pytest
configuration) score 0. The module is `swe_env`; the environment id is `swe`.
"""

from __future__ import annotations

from pathlib import Path

from rlkit import sandbox
from rlkit.errors import UsageError
from swe_env.env import SWEEnv, gold_edits
from swe_env.exploits import SWE_EXPLOITS
from swe_env.session import Grade, RepoSession, SessionLimits
from swe_env.tasks import DATA_DIR, Task, load_tasks
from swe_env.testrun import SandboxFailure

SHIPPED = DATA_DIR / "tasks.jsonl.gz"

__all__ = [
    "Grade",
    "RepoSession",
    "SWEEnv",
    "SWE_EXPLOITS",
    "SandboxFailure",
    "SessionLimits",
    "Task",
    "gold_edits",
    "load_environment",
    "load_tasks",
]


def load_environment(
    tasks: str = "shipped",
    repos: list[str] | None = None,
    num_examples: int = -1,
    max_turns: int = 30,
    command_timeout: float = 30.0,
    test_timeout: float = 120.0,
    rollout_timeout: float = 900.0,
    memory_mb: int = 256,
    output_chars: int = 8000,
) -> SWEEnv:
    """Build the environment from the shipped tasks or a task JSONL (SWE-bench field names);
    `repos` keeps only tasks of those repositories."""
    sandbox.require()  # no isolation: refuse now, with the fix, not per rollout
    path = SHIPPED if tasks == "shipped" else Path(tasks).expanduser()
    if not path.is_file():
        raise UsageError(f"swe environment: task file {str(path)!r} not found")
    rows = load_tasks(path)
    if repos:
        unknown = set(repos) - {task.repo for task in rows}
        if unknown:
            raise UsageError(f"swe environment: no tasks for repos {sorted(unknown)}")
        rows = [task for task in rows if task.repo in repos]
    if num_examples > 0:
        rows = rows[:num_examples]
    if not rows:
        raise UsageError(f"swe environment: {path} holds no tasks")
    limits = SessionLimits(
        command_timeout=command_timeout,
        test_timeout=test_timeout,
        rollout_timeout=rollout_timeout,
        memory_mb=memory_mb,
        output_chars=output_chars,
    )
    env = SWEEnv(rows, limits=limits, max_turns=max_turns, env_id="swe")
    env.exploits.extend(SWE_EXPLOITS)
    return env
