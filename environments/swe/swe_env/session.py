"""One rollout's repository: a writable copy of the buggy tree, the agent's tools on it, grading.

Every `bash` command runs in a fresh bubblewrap sandbox (no network, read-only system, the
copy bound read-write as /sandbox and nothing else writable but a private /tmp, pytest from a
read-only runtime tree, rlimits and a wall-clock limit); the copy persists between commands, so
the session's state is the repository. When a command ends its whole process tree dies with its
pid namespace, so `view` and `str_replace` can work on the copy from the host without racing
anything; their paths are resolved and must stay inside the copy (symlinks included).

Grading never trusts the agent's copy: it builds a fresh tree from the buggy tree plus the
agent's changes to unprotected files only, reports whether protected files were changed, and
runs the task's test files on that tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rlkit import sandbox
from rlkit.sandbox.workspace import base_dir, writable_copy
from swe_env.tasks import Task, materialize, patched_files
from swe_env.testrun import SandboxFailure, mounts, repo_prelude, run_tests


class SessionLimits(BaseModel):
    """Limits of one rollout's sandbox session."""

    command_timeout: float = Field(default=30.0, description="wall-clock seconds per bash command")
    test_timeout: float = Field(default=120.0, description="wall-clock seconds for grading tests")
    rollout_timeout: float = Field(default=900.0, description="seconds of tool time per rollout")
    memory_mb: int = Field(
        default=256,
        description="address space per process (MiB); the sandbox's total memory cap divided by "
        "it bounds the processes and threads a command may run (2048 // 256 = 8)",
    )
    output_chars: int = Field(default=8000, description="tool output kept (head + tail) per call")
    max_repo_mb: int = Field(default=200, description="size of the repository copy that ends it")


@dataclass
class Grade:
    """The outcome of grading one rollout (SWE-bench's rule: resolved = all F2P and P2P pass)."""

    resolved: bool
    fail_to_pass_fixed: float
    pass_to_pass_broken: int
    protected_files_modified: bool
    verdict_forged: bool = False
    verdict_problem: str | None = None  # why the verdict was not trusted (forged), if it was not
    outcomes: dict[str, str] = field(default_factory=dict)
    output: str = ""


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of long output, saying how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-limit // 2 :]
    return f"{head}\n[... output truncated: {len(text) - limit} characters omitted ...]\n{tail}"


def _entries(root: Path) -> dict[str, Path]:
    """Repository-relative path -> path of every file and symlink (symlinks not followed)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [
            *filenames,
            *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))),
        ]:
            path = Path(dirpath) / name
            found[path.relative_to(root).as_posix()] = path
    return found


def _same(a: Path | None, b: Path | None) -> bool:
    if a is None or b is None:
        return a is b
    sa, sb = a.lstat(), b.lstat()
    if stat.S_ISLNK(sa.st_mode) or stat.S_ISLNK(sb.st_mode):
        return stat.S_ISLNK(sa.st_mode) == stat.S_ISLNK(sb.st_mode) and (
            os.readlink(a) == os.readlink(b)
        )
    return stat.S_ISREG(sa.st_mode) and a.read_bytes() == b.read_bytes()


class RepoSession:
    """`async with RepoSession(task) as s: await s.bash("ls"); s.view(...); await s.grade()`."""

    def __init__(self, task: Task, limits: SessionLimits | None = None) -> None:
        self.task = task
        self.limits = limits or SessionLimits()
        self.submitted = False
        self.tool_errors = 0
        self.exhausted: str | None = None  # why the session refuses further tool calls
        self._stack = contextlib.ExitStack()
        self._deadline = 0.0
        self.pristine = Path()
        self.repo = Path()

    async def __aenter__(self) -> RepoSession:
        try:
            scratch = Path(self._stack.enter_context(tempfile.TemporaryDirectory(dir=base_dir())))
            self.pristine = scratch / "buggy"
            materialize(self.task, self.pristine)
            self.repo = self._stack.enter_context(writable_copy(self.pristine))
        except BaseException:
            self._stack.close()
            raise
        self._deadline = time.monotonic() + self.limits.rollout_timeout
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stack.close()

    def _protected(self, relpath: str) -> bool:
        return self.task.is_protected(relpath) or relpath in patched_files(self.task.test_patch)

    # ---- tools -------------------------------------------------------------------------------
    def check_budget(self) -> None:
        if self.exhausted is None and time.monotonic() > self._deadline:
            self.exhausted = f"the rollout's time limit ({self.limits.rollout_timeout:g} s) is over"
        if self.exhausted:
            raise RuntimeError(self.exhausted)

    async def bash(self, command: str) -> str:
        """Run one command in the repository; output (stdout and stderr) and exit status."""
        self.check_budget()
        script = "\n".join(
            [
                *repo_prelude(self.task.pythonpath),
                "export PYTEST_ADDOPTS='-p no:cacheprovider'",
                'python() { python3 "$@"; }; export -f python',
                "exec 2>&1",
                command,
            ]
        )
        result = await sandbox.run(
            script,
            language="bash",
            timeout=self.limits.command_timeout,
            memory_mb=self.limits.memory_mb,
            mounts=mounts(self.repo),
        )
        if result.status == "sandbox_error":
            raise SandboxFailure(f"bash sandbox failed: {result.stderr.strip()[-300:]}")
        text = truncate(result.stdout, self.limits.output_chars)
        if result.status == "timeout":
            text += f"\n[command timed out after {self.limits.command_timeout:g} s and was killed]"
        elif result.status == "output_limit":
            text += "\n[command produced too much output and was killed]"
        else:
            text += f"\n[exit code {result.exit_code}]"
        self._check_size()
        return text.lstrip("\n")

    def _check_size(self) -> None:
        total = sum(p.lstat().st_size for p in _entries(self.repo).values())
        if total > self.limits.max_repo_mb * 2**20:
            self.exhausted = f"the repository grew past {self.limits.max_repo_mb} MB"

    def resolve(self, path: str) -> Path:
        """A path the agent named (relative, or absolute under /sandbox), resolved inside the
        repository copy; anything else, or a missing file, is a ValueError."""
        if path.startswith("/") and not (path + "/").startswith("/sandbox/"):
            raise ValueError(f"{path!r} is outside the repository (/sandbox)")
        relative = path.removeprefix("/sandbox").lstrip("/") or "."
        target = (self.repo / relative).resolve()
        if not target.is_relative_to(self.repo.resolve()):
            raise ValueError(f"{path!r} is outside the repository")
        if not target.exists():
            raise ValueError(f"{path!r}: no such file or directory")
        return target

    def view(self, path: str, start: int = 1, end: int = -1) -> str:
        self.check_budget()
        target = self.resolve(path)
        if target.is_dir():
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
            return truncate("\n".join(names), self.limits.output_chars)
        lines = target.read_text(errors="replace").splitlines()
        end = len(lines) if end < 0 else min(end, len(lines))
        if start < 1 or start > max(end, 1):
            raise ValueError(f"start must be between 1 and {max(end, 1)}, got {start}")
        body = "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(start, end + 1))
        return truncate(body, self.limits.output_chars) or "(empty file)"

    def str_replace(self, path: str, old: str, new: str) -> str:
        self.check_budget()
        target = self.resolve(path)
        text = target.read_text()
        count = text.count(old) if old else 0
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise ValueError(f"old {where} in {path}; it must occur exactly once")
        target.write_text(text.replace(old, new, 1))
        return f"Replaced 1 occurrence in {path}."

    # ---- grading -----------------------------------------------------------------------------
    def _graded_tree(self, dest: Path) -> bool:
        """Buggy tree + the agent's unprotected changes into `dest`; True if protected changed."""
        shutil.copytree(self.pristine, dest, symlinks=True)
        mine, theirs = _entries(self.pristine), _entries(self.repo)
        protected_changed = False
        for rel in sorted(mine.keys() | theirs.keys()):
            if _same(mine.get(rel), theirs.get(rel)):
                continue
            if self._protected(rel):
                protected_changed = True
                continue
            target = dest / rel
            if target.is_symlink() or target.is_file():
                target.unlink()
            source = theirs.get(rel)
            if source is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_symlink():
                target.symlink_to(os.readlink(source))
            elif stat.S_ISREG(source.lstat().st_mode):
                shutil.copyfile(source, target)
        return protected_changed

    async def grade(self) -> Grade:
        """Run FAIL_TO_PASS and PASS_TO_PASS on the agent's (unprotected) changes."""
        with tempfile.TemporaryDirectory(dir=base_dir()) as scratch:
            graded = Path(scratch) / "graded"
            protected_changed = self._graded_tree(graded)
            result, verdict = await run_tests(
                graded,
                self.task.pythonpath,
                self.task.test_files(),
                self.limits.test_timeout,
                self.limits.memory_mb,
                config_tree=self.pristine,
            )
        outcomes = verdict.outcomes  # empty when the verdict is incomplete or forged
        forged = verdict.forged is not None
        fixed = [outcomes.get(t) == "PASSED" for t in self.task.FAIL_TO_PASS]
        broken = sum(outcomes.get(t) != "PASSED" for t in self.task.PASS_TO_PASS)
        return Grade(
            resolved=all(fixed) and broken == 0 and not protected_changed and not forged,
            fail_to_pass_fixed=sum(fixed) / max(len(fixed), 1),
            pass_to_pass_broken=broken,
            protected_files_modified=protected_changed,
            verdict_forged=forged,
            verdict_problem=verdict.forged,
            outcomes=outcomes,
            output=result.stdout,
        )
