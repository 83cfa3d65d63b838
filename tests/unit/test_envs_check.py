"""`rlkit env check`: scripted gold, empty and garbage replies through each environment's own
rollout (tools really run), scored by its rubric; the CLI's exit codes; the check before push."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset

from rlkit.envs import Rubric, SingleTurnEnv, ToolEnv
from rlkit.envs.check import ScriptedClient, check_environment, report_lines
from rlkit.envs.parsers import last_assistant_text
from rlkit.hub import build_env, init_env
from rlkit.inference import InferenceError
from tests.helpers.cli import run_cli

SECRETS = {"alpha": "17", "beta": "42"}
ROWS = Dataset.from_dict({"question": ["What is alpha?", "What is beta?"], "answer": ["17", "42"]})
CLI = [sys.executable, "-c", "from rlkit_cli.main import main; main()"]


def tool_call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


class LookupEnv(ToolEnv):
    """The answer is only known by calling `lookup`; the reward needs the tool's real result."""

    def __init__(self, **kwargs: Any) -> None:
        self.calls: list[str] = []

        def lookup(key: str) -> str:
            """Look a secret up.

            Args:
                key: The secret's name.
            """
            self.calls.append(key)
            return SECRETS[key]

        def correct(completion: list[dict[str, Any]], answer: str) -> float:
            looked_up = any(m["role"] == "tool" and m["content"] == answer for m in completion)
            return float(looked_up and last_assistant_text(completion).strip() == answer)

        super().__init__([lookup], dataset=ROWS, rubric=Rubric([correct]), **kwargs)

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        key = row["prompt"][-1]["content"].split()[-1].rstrip("?")
        return [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call("c1", "lookup", key=key)],
            },
            {"role": "assistant", "content": row["answer"]},
        ]


def test_gold_tool_calls_really_execute() -> None:
    env = LookupEnv(max_turns=4)
    report = check_environment(env, num_rows=2, gold=True)
    assert report.ok, report_lines(report)
    assert report.summary() == {"gold": (2, 2), "empty": (2, 2), "garbage": (2, 2)}
    assert sorted(env.calls) == ["alpha", "beta"]
    assert report.split == "train" and report.train_size == 2 and report.eval_size is None


class WrongGoldEnv(LookupEnv):
    """Gold scripts that are wrong in each way the check must notice, one per row."""

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        gold = super().gold_completion(row)
        if row["answer"] == "17":  # stops after the tool call: the env wants another turn
            return gold[:1]
        return [*gold, {"role": "assistant", "content": "one message too many"}]


def test_wrong_gold_scripts_are_reported_per_row() -> None:
    report = check_environment(WrongGoldEnv(max_turns=4), num_rows=2, gold=True)
    problems = {case.example_id: case.problem for case in report.failures}
    assert not report.ok and set(problems) == {0, 1}
    assert "asked for model turn 2" in problems[0]
    assert "ended after 2 model turn(s) but the gold completion has 3" in problems[1]
    assert any(line.startswith("FAIL row 0 [gold]") for line in report_lines(report))


def test_partial_credit_for_garbage_and_raising_rewards_are_failures() -> None:
    def any_text(completion: list[dict[str, Any]]) -> float:
        return 0.5 if last_assistant_text(completion) else 0.0

    lenient = SingleTurnEnv(dataset=ROWS, rubric=Rubric([any_text]))
    report = check_environment(lenient, num_rows=1)
    assert [(c.kind, c.ok) for c in report.cases] == [("empty", True), ("garbage", False)]
    assert report.failures[0].problem == "reward 0.5, expected 0"

    def broken(completion: list[dict[str, Any]]) -> float:
        raise RuntimeError("boom")

    report = check_environment(SingleTurnEnv(dataset=ROWS, rubric=Rubric([broken])), num_rows=1)
    assert all("reward function 'broken' failed" in (c.problem or "") for c in report.cases)


def test_missing_gold_is_a_failure_not_a_crash() -> None:
    env = SingleTurnEnv(dataset=ROWS, rubric=Rubric([lambda completion: 0.0]))
    report = check_environment(env, num_rows=2, gold=True)
    gold = [case for case in report.cases if case.kind == "gold"]
    assert len(gold) == 2 and all("no gold completion" in (c.problem or "") for c in gold)


async def test_scripted_client_repeats_or_runs_out() -> None:
    once = ScriptedClient([{"role": "assistant", "content": "hi"}])
    assert (await once.chat([], "m")).text == "hi"
    with pytest.raises(InferenceError, match="asked for model turn 2"):
        await once.chat([], "m")
    again = ScriptedClient([{"role": "assistant", "content": "x"}], repeat=True)
    assert [(await again.chat([], "m")).text for _ in range(3)] == ["x", "x", "x"]
    assert not ScriptedClient.supports_token_prompts


def test_cli_exit_codes(monkeypatch, capsys, tmp_path: Path) -> None:
    code, out = run_cli(monkeypatch, capsys, "env", "check", "reverse-text", "--gold", "-n", "20")
    assert code == 0 and "gold: 20/20 as expected" in out and out.rstrip().endswith("OK")
    module = init_env("nogold-env", tmp_path) / "nogold_env" / "__init__.py"
    source = module.read_text()  # the scaffold has a gold completion: this one drops it
    gold = source.index("    def gold_completion")
    module.write_text(source[:gold] + "    pass\n" + source[source.index("\n\n\n", gold) :])
    monkeypatch.setenv("RLKIT_ENV_PATH", str(tmp_path))
    code, out = run_cli(monkeypatch, capsys, "env", "check", "nogold-env", "--gold", "-n", "2")
    assert code == 1 and "FAIL row 0 [gold]" in out and "no gold completion" in out
    code, out = run_cli(monkeypatch, capsys, "env", "check", "nogold-env", "-n", "2")
    assert code == 0 and "empty: 2/2 as expected" in out
    for args, message in [
        (["reverse-text", "-a", "{bad"], "-a/--env-args is not valid JSON"),
        (["reverse-text", "--split", "test"], "Invalid value for '--split'"),
        (["no-such-env"], "unknown environment"),
        (["reverse-text", "-a", '{"min_len": 0}'], "bad arguments for environment"),
    ]:
        code, out = run_cli(monkeypatch, capsys, "env", "check", *args)
        assert code == 2 and message in out, out


@pytest.mark.slow  # two `rlkit env push` processes, each checking the environment
def test_push_checks_first(tmp_path: Path) -> None:
    package = init_env("lenient-env", tmp_path)
    module = package / "lenient_env" / "__init__.py"
    exact = "return 1.0 if parsed is not None and parsed.strip() == answer.strip() else 0.0"
    module.write_text(module.read_text().replace(exact, "return 1.0"))  # scores anything
    build_env(package, isolation=False)
    hub = ["--hub", str(tmp_path / "hub")]
    env = {**os.environ, "RLKIT_HOME": str(tmp_path / "home")}
    push = [*CLI, "env", "push", str(package), *hub]
    refused = subprocess.run(push, capture_output=True, text=True, env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "[empty]" in refused.stdout and "not published" in refused.stdout
    published = subprocess.run([*push, "--skip-check"], capture_output=True, text=True, env=env)
    assert published.returncode == 0, published.stdout + published.stderr
    assert "published" in published.stdout


def test_run_group_keeps_a_raising_rollout_and_a_failing_scorer_as_errors() -> None:
    """`run_group` is the one group path (eval and training): an environment bug never raises."""

    class Flaky(SingleTurnEnv):
        async def rollout(self, row, client, model, sampling):  # type: ignore[no-untyped-def]
            if row["answer"] == "42":
                raise RuntimeError("env bug")
            return await super().rollout(row, client, model, sampling)

    class BrokenScorer(SingleTurnEnv):
        async def score_group(self, rollouts):  # type: ignore[no-untyped-def]
            raise ValueError("bad group")

    env = Flaky(dataset=ROWS, rubric=Rubric([lambda completion: 1.0]))
    client = ScriptedClient([{"role": "assistant", "content": "17"}], repeat=True)
    rows = list(env.get_dataset())
    ok, failed = (asyncio.run(env.run_group(row, client, "m", {}, 2)) for row in rows)
    assert [r.error for r in ok] == [None, None] and all(r.reward == 1.0 for r in ok)
    assert [r.error for r in failed] == ["rollout failed: RuntimeError: env bug"] * 2

    broken = BrokenScorer(dataset=ROWS, rubric=Rubric([lambda completion: 1.0]))
    scored = asyncio.run(broken.run_group(rows[0], client, "m", {}, 2))
    assert [r.error for r in scored] == ["scoring failed: ValueError: bad group"] * 2
