"""`rlkit eval code` end to end: the fake server (reference solutions, garbage, failures, a
broken sandbox) and the real vLLM CPU tiny model. Errored rollouts are counted, nothing crashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from code_env.dataset import OFFLINE

from rlkit import sandbox
from rlkit.eval import EvalConfig, load_run, run_eval
from rlkit.sandbox import SandboxResult
from tests.helpers.cli import only_run_dir, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer

PROBLEMS = [json.loads(line) for line in OFFLINE.read_text().splitlines()]


def reference_model(body: dict[str, Any]) -> str:
    """Answers each offline problem with its reference solution, found by the question text."""
    question = next(m["content"] for m in body["messages"] if m["role"] == "user")
    problem = next(p for p in PROBLEMS if question.startswith(p["question"]))
    return f"<think>easy</think>\n```python\n{problem['reference']}```"


def garbage_model(body: dict[str, Any]) -> str:
    return "```python\nthis is not python (\n```"


@pytest.mark.system
def test_eval_code_with_reference_solutions_scores_one(tmp_path, monkeypatch, capsys) -> None:
    n = len(PROBLEMS)
    with FakeOpenAIServer(responder=reference_model) as server:
        code, output = run_cli(
            monkeypatch, capsys, "eval", "code", "-m", "fake-model", "-b", server.url,
            "-n", str(n), "-r", "1", "-o", str(tmp_path / "out"),
        )  # fmt: skip
    assert code == 0, output
    run = load_run(only_run_dir(tmp_path / "out"))
    assert len(run.results) == n
    assert all(r.rollout.error is None and r.rollout.reward == 1.0 for r in run.results)
    assert run.metadata.summary["errors"] == 0
    assert run.metadata.summary["pass_at_k"]["pass@1"] == 1.0


@pytest.mark.system
def test_eval_code_with_garbage_and_failures_counts_errors(tmp_path, monkeypatch, capsys) -> None:
    with FakeOpenAIServer(responder=garbage_model, fail_rate=0.4, fail_statuses=[500]) as server:
        code, output = run_cli(
            monkeypatch, capsys, "eval", "code", "-m", "fake-model", "-b", server.url,
            "-n", "6", "-r", "2", "--max-retries", "0", "-o", str(tmp_path / "out"),
        )  # fmt: skip
    assert code == 1, output  # rollouts errored: rlkit eval says so in its exit status
    assert "errored rollouts" in output
    run = load_run(only_run_dir(tmp_path / "out"))
    assert len(run.results) == 12
    errored = [r for r in run.results if r.rollout.error]
    assert run.metadata.summary["errors"] == len(errored) == server.stats[500] > 0
    assert all(r.rollout.reward == 0.0 for r in run.results)


def test_broken_sandbox_errors_rollouts_instead_of_scoring_zero(tmp_path, monkeypatch) -> None:
    async def broken_run(code: str, **kwargs: Any) -> SandboxResult:
        return SandboxResult(status="sandbox_error", stderr="bwrap: setting up uid map: denied")

    monkeypatch.setattr(sandbox, "run", broken_run)
    with FakeOpenAIServer(responder=reference_model) as server:
        config = EvalConfig(
            env_id="code", model="fake-model", base_url=server.url, num_examples=3,
            rollouts_per_example=2, output_dir=tmp_path / "out",
        )  # fmt: skip
        run = load_run(run_eval(config))
    assert run.metadata.summary["errors"] == 6
    assert all("sandbox failed" in r.rollout.error for r in run.results)


@pytest.mark.system
@pytest.mark.slow
def test_eval_code_against_the_real_tiny_model(
    vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys
) -> None:
    code, output = run_cli(
        monkeypatch, capsys, "eval", "code", "-m", str(tiny_model_dir), "-b", vllm_server.url,
        "-n", "4", "-r", "2", "-t", "48", "-o", str(tmp_path / "out"),
        "--token-file", str(vllm_server.token_file),
    )  # fmt: skip
    assert code == 0, output
    run = load_run(only_run_dir(tmp_path / "out"))
    assert len(run.results) == 8
    for result in run.results:
        rollout = result.rollout
        assert rollout.error is None, rollout.error
        assert 0.0 <= rollout.reward <= 1.0
        assert rollout.turns[0].completion_token_ids
    assert run.metadata.summary["errors"] == 0


@pytest.mark.slow  # `rlkit eval` in a subprocess (~7 s)
def test_without_bubblewrap_the_code_env_refuses_with_the_fix(tmp_path: Path) -> None:
    """No isolation (bwrap hidden from PATH): `rlkit eval code` stops before any rollout and
    says how to install bubblewrap; nothing falls back to running the code unisolated."""
    env = {**os.environ, "PATH": str(tmp_path / "no-bwrap-here"), "RLKIT_HOME": str(tmp_path)}
    env.pop("RLKIT_SANDBOX_BACKEND", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit_cli.main", "eval", "code", "-m", "m",
         "-b", "http://127.0.0.1:9/v1", "-o", str(tmp_path / "runs")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "bwrap is not installed" in proc.stderr
    assert "apt-get install bubblewrap" in proc.stderr
    assert "RLKIT_SANDBOX_BACKEND=local" in proc.stderr
    assert not (tmp_path / "runs").exists()
