"""The SWE task format (SWE-bench field names) and how a task's buggy tree is obtained.

A task names a source tree (`repo`: a tree shipped under `swe_env/repos/` or a path to one),
how to get the buggy tree from it (`base`: a unified diff against the tree, or a commit of a git
repository), the gold fix (`patch`, a unified diff against the buggy tree), the tests that must
go from failing to passing (`FAIL_TO_PASS`) and keep passing (`PASS_TO_PASS`) as pytest node ids,
and the paths the agent must not change (`protected_paths`, fnmatch patterns on repository-
relative paths). SWE-bench JSONL rows load with the same code (list fields may be JSON strings).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from fnmatch import fnmatch
from io import BytesIO
from pathlib import Path
from typing import Any

import whatthepatch
from pydantic import BaseModel, Field, field_validator

REPOS_DIR = Path(__file__).parent / "repos"
DATA_DIR = Path(__file__).parent / "data"
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
# The test runner, its plugin system, its configuration and the interpreter's start-up hooks,
# anywhere in the repository: protected in every task whatever its own list says (the grader
# never runs them, and a rollout that changes them scores 0).
GRADER_PROTECTED = [
    "pytest.py",
    "*/pytest.py",
    "pytest/*",
    "*/pytest/*",
    "_pytest/*",
    "*/_pytest/*",
    "pluggy.py",
    "*/pluggy.py",
    "pluggy/*",
    "*/pluggy/*",
    "py.py",
    "*/py.py",
    "*pytest.toml",
    "*pytest.ini",
    "*tox.ini",
    "*setup.cfg",
    "*pyproject.toml",
    "*conftest.py",
    "*sitecustomize.py",
    "*usercustomize.py",
    "*.pth",
]
# Files that steer test collection or packaging: never the agent's to change.
DEFAULT_PROTECTED = [
    "*conftest.py",
    "setup.py",
    "*setup.cfg",
    "*pyproject.toml",
    "*tox.ini",
    "*pytest.ini",
    "sitecustomize.py",
    "usercustomize.py",
]


class Task(BaseModel):
    """One SWE task; field names follow SWE-bench where it has them."""

    instance_id: str = Field(description="unique id, e.g. 'inflection__mut-0003'")
    repo: str = Field(description="a tree shipped under swe_env/repos/ or a path to a source tree")
    base: str = Field(
        default="", description="unified diff from the repo tree to the buggy tree, or a commit"
    )
    problem_statement: str = Field(description="the issue text shown to the agent")
    patch: str = Field(description="the gold fix: a unified diff against the buggy tree")
    test_patch: str = Field(default="", description="diff adding tests, applied before grading")
    FAIL_TO_PASS: list[str] = Field(description="pytest node ids failing before the fix")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="node ids passing both")
    protected_paths: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROTECTED),
        description="fnmatch patterns of repository paths the agent must not change",
    )
    language: str = Field(default="python", description="the repository's language")
    difficulty: str = Field(default="", description="easy / medium / hard")
    pythonpath: list[str] = Field(
        default_factory=lambda: ["."], description="import roots relative to the repository"
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="how the task was made")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "protected_paths", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """SWE-bench stores these lists as JSON strings."""
        return json.loads(value) if isinstance(value, str) else value

    def source_tree(self) -> Path:
        """The unmodified tree this task starts from."""
        shipped = REPOS_DIR / self.repo
        path = shipped if shipped.is_dir() else Path(self.repo).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"task {self.instance_id}: repository {self.repo!r} not found")
        return path

    def is_protected(self, relpath: str) -> bool:
        """Whether the agent must not change `relpath` (the task's list or `GRADER_PROTECTED`)."""
        patterns = [*GRADER_PROTECTED, *self.protected_paths]
        return any(fnmatch(relpath, pattern) for pattern in patterns)

    def test_files(self) -> list[str]:
        """The test files holding the graded tests (what the grader runs)."""
        ids = [*self.FAIL_TO_PASS, *self.PASS_TO_PASS]
        return sorted({node.split("::", 1)[0] for node in ids})


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file (optionally gzip-compressed)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [Task.model_validate_json(line) for line in handle if line.strip()]


def write_tasks(tasks: Iterable[Task], path: Path) -> None:
    """Write tasks as JSONL (gzip when the name ends in .gz; no timestamp, so reproducible)."""
    text = "".join(task.model_dump_json() + "\n" for task in tasks)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def apply_patch(tree: Path, patch: str) -> list[str]:
    """Apply a unified diff to the files under `tree` in place; returns the changed paths.

    Raises ValueError when a hunk does not apply (the tree is not the one the patch was made on).
    """
    changed = []
    for diff in whatthepatch.parse_patch(patch):
        if diff.header is None:
            continue
        relpath = diff.header.new_path.removeprefix("b/")
        if diff.header.new_path == "/dev/null":
            relpath = diff.header.old_path.removeprefix("a/")
        target = tree / relpath
        if not target.resolve().is_relative_to(tree.resolve()):
            raise ValueError(f"patch touches {relpath!r} outside the repository")
        old = target.read_text() if target.exists() else ""
        try:
            lines = whatthepatch.apply_diff(diff, old)
        except whatthepatch.exceptions.HunkApplyException as exc:
            raise ValueError(f"patch does not apply to {relpath}: {exc}") from exc
        if diff.header.new_path == "/dev/null":
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(lines) + "\n" if lines else "")
        changed.append(relpath)
    return changed


def patched_files(patch: str) -> list[str]:
    """Repository-relative paths a unified diff changes."""
    return [
        d.header.new_path.removeprefix("b/")
        for d in whatthepatch.parse_patch(patch)
        if d.header is not None
    ]


def materialize(task: Task, dest: Path) -> None:
    """Write the task's buggy tree (with its test patch applied) to `dest` (must not exist)."""
    source = task.source_tree()
    if COMMIT.match(task.base.strip()):
        archive = subprocess.run(
            ["git", "-C", str(source), "archive", task.base.strip()],
            capture_output=True,
            check=True,
        ).stdout
        dest.mkdir(parents=True)
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    else:
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        if task.base.strip():
            apply_patch(dest, task.base)
    if task.test_patch.strip():
        apply_patch(dest, task.test_patch)
