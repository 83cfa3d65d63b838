"""The `swe` environment end to end with scripted agents (the fake OpenAI server returning tool
calls) and the real bubblewrap sandbox: gold fixes score 1, unchanged trees and edited tests 0,
hostile commands stay contained, concurrent rollouts do not interfere, a broken sandbox errors."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from swe_env import SHIPPED, SWEEnv, load_environment, load_tasks
from swe_env import testrun as testrun_mod
from swe_env.make_tasks import make
from swe_env.mutate import function_mutants
from swe_env.tasks import REPOS_DIR, Task

from rlkit import sandbox
from rlkit.envs.rollout import Rollout
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.system

TASKS = load_tasks(SHIPPED)
Script = list[dict[str, Any]]


@pytest.fixture(autouse=True)
def _bwrap_backend() -> None:
    if not sandbox.active_backend().isolated:
        pytest.fail("the swe environment's tests need bubblewrap")


def first_tasks(repo: str, n: int) -> list[Task]:
    return [task for task in TASKS if task.repo == repo][:n]


def env_for(tasks: list[Task], **limits: Any) -> SWEEnv:
    from swe_env.session import SessionLimits

    return SWEEnv(tasks, limits=SessionLimits(**limits), max_turns=12, env_id="swe")


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant message with one tool call."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": function}]}


def scripted(scripts: dict[str, Script]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A responder playing each task's script (found by its issue text), turn by turn."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        issue = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        return scripts[issue][turn]

    return respond


async def play(env: SWEEnv, scripts: dict[str, Script]) -> list[Rollout]:
    """One rollout per row, concurrently, each agent following its script."""
    rows = list(env.get_dataset())
    with FakeOpenAIServer(responder=scripted(scripts)) as server:
        client = InferenceClient(server.url)
        groups = await asyncio.gather(
            *(env.run_group(r, client, "fake-model", {}, 1) for r in rows)
        )
    return [group[0] for group in groups]


def issue(task: Task) -> str:
    return task.problem_statement


def gold_script(env: SWEEnv, task: Task) -> Script:
    row = next(r for r in env.get_dataset() if r["info"]["instance_id"] == task.instance_id)
    return env.gold_completion(row) or []


def test_shipped_tasks_cover_the_issue() -> None:
    repos = {task.repo for task in TASKS}
    assert len(TASKS) >= 150 and len(repos) >= 4
    assert len({task.instance_id for task in TASKS}) == len(TASKS)
    for repo in repos:
        assert any(REPOS_DIR.joinpath(repo).glob("LICENSE*")), repo
    for task in TASKS:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS and task.difficulty
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert task.patch and task.base and "Failing tests:" in task.problem_statement


async def test_gold_resolves_and_the_buggy_tree_does_not() -> None:
    tasks = [*first_tasks("inflection", 1), *first_tasks("parse", 1), *first_tasks("isodate", 1)]
    env = env_for(tasks)
    gold = await play(env, {issue(t): gold_script(env, t) for t in tasks})
    assert [(r.error, r.reward) for r in gold] == [(None, 1.0)] * len(tasks)
    assert all(r.metrics["fail_to_pass_fixed"] == 1.0 for r in gold)
    untouched = await play(env, {issue(t): [call("submit")] for t in tasks})
    assert [(r.error, r.reward) for r in untouched] == [(None, 0.0)] * len(tasks)
    assert all(r.metrics["fail_to_pass_fixed"] < 1.0 for r in untouched)


async def test_editing_protected_files_scores_zero_even_with_the_fix() -> None:
    task = first_tasks("inflection", 1)[0]
    env = env_for([task])
    fix = gold_script(env, task)[:-1]
    test_file = task.FAIL_TO_PASS[0].split("::")[0]
    for hack in (f"echo 'assert True' >> {test_file}", "echo 'import os' > conftest.py"):
        [rollout] = await play(
            env, {issue(task): [*fix, call("bash", command=hack), call("submit")]}
        )
        assert rollout.error is None
        assert rollout.reward == 0.0
        assert rollout.metrics["protected_files_modified"] == 1.0
        # The graded tree had the fix and the original tests: the F2P tests passed there.
        assert rollout.metrics["fail_to_pass_fixed"] == 1.0


async def test_tools_report_errors_truncate_and_time_out() -> None:
    task = first_tasks("inflection", 1)[0]
    env = env_for([task], command_timeout=2, output_chars=300)
    source = task.metadata["file"]
    script = [
        call("view", path=source, start=1, end=3),
        call("view", path="/etc/passwd"),
        call("str_replace", path=source, old="this text is not in the file", new="x"),
        call("bash", command="seq 1 5000"),
        call("bash", command="sleep 30"),
        call("not_a_tool"),
        {"role": "assistant", "content": "I give up."},
    ]
    [rollout] = await play(env, {issue(task): script})
    replies = [m["content"] for m in rollout.completion if m["role"] == "tool"]
    assert replies[0].splitlines()[0].strip().startswith("1\t")
    assert "outside the repository" in replies[1]
    assert "does not occur" in replies[2]
    assert "output truncated" in replies[3] and "5000" in replies[3]
    assert "timed out after 2 s" in replies[4]
    assert "unknown tool" in replies[5]
    assert rollout.error is None and rollout.reward == 0.0
    assert rollout.metrics["tool_errors"] == 3.0  # outside path, missing text, unknown tool
    assert rollout.metrics["turns"] == 7.0


async def test_hostile_commands_are_contained_and_others_unaffected(tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    victim, bystander = first_tasks("inflection", 2)
    env = env_for([victim, bystander], command_timeout=10)
    listener = socket.create_server(("127.0.0.1", 0))  # a host service the sandbox must not reach
    port = listener.getsockname()[1]
    connect = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); "
        "print('CONNECTED')\"; python3 -c \"import socket; "
        "socket.create_connection(('1.1.1.1', 80), timeout=2); print('CONNECTED')\""
    )
    hostile = [
        call("bash", command=f"cat {canary} /etc/passwd /root/.bashrc; ls /home /work"),
        call("bash", command="ln -s /etc/passwd leak && ln -s / root"),
        call("view", path="leak"),
        call("view", path="root/etc/passwd"),
        call("bash", command=connect),
        call("bash", command="bomb() { bomb | bomb & }; bomb; sleep 3; echo survived"),
        call("bash", command="rm -rf --no-preserve-root / 2>/dev/null; ls -A /sandbox | wc -l"),
        call("submit"),
    ]
    scripts = {issue(victim): hostile, issue(bystander): gold_script(env, bystander)}
    with listener:
        by_id = {r.info["instance_id"]: r for r in await play(env, scripts)}
    attacked, fixed = by_id[victim.instance_id], by_id[bystander.instance_id]
    assert (fixed.error, fixed.reward) == (None, 1.0)
    assert attacked.error is None and attacked.reward == 0.0
    replies = [m["content"] for m in attacked.completion if m["role"] == "tool"]
    transcript = "\n".join(replies)
    assert "root:x:0:0" not in transcript and "still here" not in transcript
    assert "No such file" in replies[0]
    assert "outside the repository" in replies[2] and "outside the repository" in replies[3]
    assert "CONNECTED" not in replies[4]
    assert "Connection refused" in replies[4] and "Network is unreachable" in replies[4]
    assert "[exit code" in replies[5] or "timed out" in replies[5]
    assert "0" in replies[6].splitlines()  # the repository copy itself was wiped ...
    assert canary.read_text() == "still here"  # ... and nothing outside it
    assert (REPOS_DIR / victim.repo / victim.metadata["file"]).exists()
    assert Path("/etc/passwd").read_text().startswith("root:")


async def test_eight_concurrent_rollouts_on_different_tasks_do_not_interfere() -> None:
    tasks = [*first_tasks("inflection", 4), *first_tasks("parse", 2), *first_tasks("toolz", 2)]
    assert len({t.instance_id for t in tasks}) == 8
    env = env_for(tasks)
    # Half fix their bug, half submit untouched; each edits only its own copy.
    scripts = {
        issue(t): gold_script(env, t) if i % 2 == 0 else [call("submit")]
        for i, t in enumerate(tasks)
    }
    rollouts = await play(env, scripts)
    rewards = {r.info["instance_id"]: r.reward for r in rollouts}
    assert all(r.error is None for r in rollouts)
    assert rewards == {t.instance_id: float(i % 2 == 0) for i, t in enumerate(tasks)}


async def test_a_broken_sandbox_marks_the_rollout_errored(monkeypatch: pytest.MonkeyPatch) -> None:
    task = first_tasks("inflection", 1)[0]
    env = env_for([task])
    script = gold_script(env, task)
    # A runtime tree that does not exist: bwrap itself fails to set up the bind.
    monkeypatch.setattr(testrun_mod, "pytest_runtime", lambda: Path("/nonexistent/runtime"))
    [graded] = await play(env, {issue(task): script})
    assert graded.error and "sandbox" in graded.error and graded.reward == 0.0
    [commanded] = await play(env, {issue(task): [call("bash", command="ls"), call("submit")]})
    assert commanded.error and "sandbox" in commanded.error


async def test_swe_bench_style_jsonl_with_a_local_git_repository(tmp_path: Path) -> None:
    """SWE-bench rows (lists as JSON strings) and `base` as a commit of a local repository."""
    task = first_tasks("inflection", 1)[0]
    repo = tmp_path / "repo"
    shutil.copytree(REPOS_DIR / task.repo, repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "original"], check=True)
    from swe_env.tasks import apply_patch

    apply_patch(repo, task.base)
    subprocess.run([*git, "commit", "-qam", "bug"], check=True)
    buggy = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    row = task.model_dump() | {
        "instance_id": "local__1",
        "repo": str(repo),
        "base": buggy.strip(),
        "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    env = load_environment(tasks=str(path))
    [loaded] = env.tasks.values()
    [rollout] = await play(env, {issue(loaded): gold_script(env, loaded)})
    assert (rollout.error, rollout.reward) == (None, 1.0)


def test_mutation_operators_keep_the_module_valid() -> None:
    source = (
        "def f(a, b):\n"
        "    x = a + b  # keep this comment\n"
        "    if a < b and not x:\n"
        "        return a - b\n"
        "    x += 1\n"
        "    return x == 2 or True\n"
    )
    mutants = function_mutants(source)
    operators = {m.operator for m in mutants}
    assert operators >= {
        "flip_binop",
        "swap_operands",
        "flip_compare",
        "swap_boolop",
        "drop_not",
        "flip_bool",
        "change_constant",
        "negate_condition",
        "remove_statement",
    }
    for mutant in mutants:
        mutated = mutant.apply(source)
        assert mutated != source
        compile(mutated, "m.py", "exec")
        if mutant.operator == "flip_binop" and mutant.start == 2:
            assert "# keep this comment" in mutated


async def test_the_factory_validates_a_task_in_the_sandbox() -> None:
    tasks, stats = await make("inflection", 1, seed=7, jobs=1, timeout=60, max_fail_fraction=0.25)
    [task] = tasks
    assert stats["validated"] == 1 and stats["validated_per_minute"] > 0
    assert task.FAIL_TO_PASS and len(task.PASS_TO_PASS) > 100
    env = env_for([task])
    [fixed] = await play(env, {issue(task): gold_script(env, task)})
    assert fixed.reward == 1.0


async def test_rollout_time_and_turn_limits_end_the_episode_and_it_is_graded() -> None:
    task = first_tasks("inflection", 1)[0]
    looping = [call("bash", command="ls")] * 20
    timed = env_for([task], rollout_timeout=1.5)
    slow = [call("bash", command="sleep 2"), *looping]
    [rollout] = await play(timed, {issue(task): slow})
    replies = [m["content"] for m in rollout.completion if m["role"] == "tool"]
    assert "time limit" in replies[-1] and len(replies) == 2
    assert rollout.error is None and rollout.reward == 0.0 and "resolved" in rollout.metrics
    capped = SWEEnv([task], max_turns=3, env_id="swe")
    [rollout] = await play(capped, {issue(task): looping})
    assert rollout.metrics["turns"] == 3.0 and rollout.error is None and rollout.reward == 0.0
