"""SWEEnv: the agent fixes a bug in a sandboxed repository copy with bash / view / str_replace /
submit, then the task's tests decide (reward 1 = resolved, else 0).

Each rollout owns a `RepoSession` (routed to the tool functions through a context variable,
since each rollout runs in its own asyncio task). The rollout ends on `submit()` (other calls in
the same message run first), on a reply without tool calls, at the turn limit, or when the
session's time or size budget is spent; then the repository is graded. A failing sandbox marks
the rollout errored (kept out of training), never reward 0.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from datasets import Dataset

from rlkit.envs import Rubric
from rlkit.envs.environment import Messages
from rlkit.envs.rollout import Rollout
from rlkit.envs.tools import ToolCall, ToolEnv, parse_tool_calls
from rlkit.inference import InferenceClient
from swe_env.session import Grade, RepoSession, SessionLimits
from swe_env.tasks import Task, apply_patch, materialize, patched_files
from swe_env.testrun import SandboxFailure

_SESSION: contextvars.ContextVar[RepoSession] = contextvars.ContextVar("swe_session")

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. The repository is the "
    "current directory (/sandbox). Use the tools: `bash` to run commands (python3, pytest, grep; "
    "no network), `view` to read files, `str_replace` to edit them. Do not modify tests or "
    "configuration files. When the bug is fixed, call `submit`."
)


def _session() -> RepoSession:
    session = _SESSION.get(None)
    if session is None:
        raise RuntimeError("SWE tools only work inside SWEEnv rollouts")
    return session


async def bash(command: str) -> str:
    """Run a bash command in the repository (the working directory) and return its output.

    Args:
        command: The shell command, e.g. `python3 -m pytest -x -q tests/test_x.py` or `grep -n foo
            pkg/mod.py`. Each call starts a fresh shell in the repository; no network access.
    """
    return await _session().bash(command)


def view(path: str, start: int = 1, end: int = -1) -> str:
    """Show a file's lines with line numbers (or list a directory).

    Args:
        path: Path relative to the repository root.
        start: First line to show (1-based).
        end: Last line to show (inclusive); -1 means the end of the file.
    """
    return _session().view(path, start, end)


def str_replace(path: str, old: str, new: str) -> str:
    """Replace the text `old` with `new` in a file; `old` must occur exactly once.

    Args:
        path: Path relative to the repository root.
        old: The exact text to replace, including indentation (extend it until it is unique).
        new: The replacement text.
    """
    return _session().str_replace(path, old, new)


def submit() -> str:
    """Submit the repository as it is now: the task's tests run and the episode ends."""
    _session().submitted = True
    return "Submitted."


def gold_edits(task: Task) -> list[dict[str, str]]:
    """`str_replace` arguments that apply the gold patch to the buggy tree, one per file.

    Each edit replaces the smallest changed line range, widened by context lines until the old
    text occurs exactly once in the buggy file.
    """
    edits = []
    with tempfile.TemporaryDirectory(prefix="swe-gold-") as tmp:
        buggy, fixed = Path(tmp) / "buggy", Path(tmp) / "fixed"
        materialize(task, buggy)
        shutil.copytree(buggy, fixed, symlinks=True)
        apply_patch(fixed, task.patch)
        for relpath in patched_files(task.patch):
            before = (buggy / relpath).read_text().splitlines(keepends=True)
            after = (fixed / relpath).read_text().splitlines(keepends=True)
            edits.append({"path": relpath, **_minimal_replace(before, after)})
    return edits


def _minimal_replace(before: list[str], after: list[str]) -> dict[str, str]:
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    blocks = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    i1, j1 = blocks[0][1], blocks[0][3]
    i2, j2 = blocks[-1][2], blocks[-1][4]
    text = "".join(before)
    while True:
        old = "".join(before[i1:i2])
        if old and text.count(old) == 1:
            return {"old": old, "new": "".join(after[j1:j2])}
        if i1 > 0:
            i1, j1 = i1 - 1, j1 - 1
        if i2 < len(before):
            i2, j2 = i2 + 1, j2 + 1
        if i1 == 0 and i2 == len(before):
            return {"old": text, "new": "".join(after)}


def _tool_call(index: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


class SWEEnv(ToolEnv):
    """Repository bug fixing with bash / view / str_replace / submit."""

    def __init__(
        self, tasks: list[Task], *args: Any, limits: SessionLimits | None = None, **kwargs: Any
    ) -> None:
        self.tasks = {task.instance_id: task for task in tasks}
        self.limits = limits or SessionLimits()
        rows = Dataset.from_list(
            [
                {
                    "question": task.problem_statement,
                    "answer": "",
                    "info": json.dumps({"instance_id": task.instance_id}),
                    "example_id": i,
                }
                for i, task in enumerate(tasks)
            ]
        )
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        super().__init__([bash, view, str_replace, submit], *args, dataset=rows, **kwargs)
        self.rubric = Rubric(
            funcs=[
                resolved,
                fail_to_pass_fixed,
                pass_to_pass_broken,
                protected_files_modified,
                verdict_forged,
                turns,
                tool_errors,
            ],
            weights=[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        )

    def task_of(self, row: dict[str, Any]) -> Task:
        info = row.get("info") or {}
        return self.tasks[info["instance_id"]]

    async def call_tool(self, call: ToolCall) -> str:
        """Failed calls count as tool errors; sandbox failures end the rollout as errored."""
        result = await super().call_tool(call)
        if result.startswith(f"Error: {call.name} raised SandboxFailure"):
            raise SandboxFailure(result)
        failed = (f"Error: {call.name} raised", "Error: unknown tool", "Error: invalid arguments")
        if call.error or result.startswith(failed):
            _session().tool_errors += 1
        return result

    async def is_completed(self, messages: Messages, state: dict[str, Any]) -> bool:
        calls = parse_tool_calls(messages[-1])
        session = _session()
        if any(call.name == "submit" for call in calls):
            for call in calls:  # the message's other calls still take effect, in order
                if call.name != "submit":
                    await self.call_tool(call)
            session.submitted = True
        return not calls or session.submitted or session.exhausted is not None

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        rollout: Rollout | None = None
        try:
            async with RepoSession(self.task_of(row), self.limits) as session:
                token = _SESSION.set(session)
                try:
                    rollout = await super().rollout(row, client, model, sampling)
                    rollout.state["tool_errors"] = session.tool_errors
                    if rollout.error is None:
                        rollout.state["grade"] = await session.grade()
                finally:
                    _SESSION.reset(token)
        except Exception as exc:  # sandbox or task infrastructure: errored, never reward 0
            rollout = rollout or self.new_rollout(row)
            rollout.error = f"sandbox failure: {type(exc).__name__}: {exc}"
        return rollout

    def gold_completion(self, row: dict[str, Any]) -> Messages | None:
        """str_replace calls applying the gold patch, one per turn, then submit()."""
        edits = gold_edits(self.task_of(row))
        messages: Messages = [
            {"role": "assistant", "content": "", "tool_calls": [_tool_call(i, "str_replace", e)]}
            for i, e in enumerate(edits)
        ]
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_tool_call(len(edits), "submit", {})],
            }
        )
        return messages


def _grade(state: dict[str, Any]) -> Grade:
    grade = state.get("grade")
    if grade is None:
        raise RuntimeError("the rollout was not graded")
    return grade


def resolved(state: dict[str, Any]) -> float:
    return float(_grade(state).resolved)


def fail_to_pass_fixed(state: dict[str, Any]) -> float:
    return _grade(state).fail_to_pass_fixed


def pass_to_pass_broken(state: dict[str, Any]) -> float:
    return float(_grade(state).pass_to_pass_broken)


def protected_files_modified(state: dict[str, Any]) -> float:
    return float(_grade(state).protected_files_modified)


def verdict_forged(state: dict[str, Any]) -> float:
    """1 when the test verdict was forged (the canary passed, a report contradicted its test)."""
    return float(_grade(state).verdict_forged)


def turns(state: dict[str, Any]) -> float:
    return float(state.get("turn", 0))


def tool_errors(state: dict[str, Any]) -> float:
    return float(state.get("tool_errors", 0))
