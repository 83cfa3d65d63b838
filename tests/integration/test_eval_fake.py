"""`rlkit eval` end to end against the fake OpenAI-compatible server (no model needed).

Covers: a custom environment in a temporary folder found by its id, reverse-text and math with
token ids and logprobs recorded, retries on 429/500, failures recorded without ending the run,
SIGINT then --resume (exactly n*r results), `eval show`, and up-front usage errors (exit 2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.eval import load_run
from tests.helpers.cli import default_sigint, only_run_dir, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer

RLKIT = str(Path(sys.executable).parent / "rlkit")  # the console script of this venv


def check_complete_run(run_dir: Path, n: int, r: int) -> list[dict]:
    """n*r lines, one per (example, rollout) key, each with token ids and matching logprobs."""
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    keys = {(rec["example_index"], rec["rollout_index"]) for rec in lines}
    assert len(lines) == n * r == len(keys)
    assert keys == {(i, j) for i in range(n) for j in range(r)}
    for rec in lines:
        assert rec["error"] is None, rec["error"]
        assert rec["turns"], rec
        for turn in rec["turns"]:
            assert turn["prompt_token_ids"] and turn["completion_token_ids"]
            assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"])
        assert rec["usage"]["completion_tokens"] > 0
        assert "generation_s" in rec["timings"]
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "complete"
    assert metadata["summary"]["num_rollouts"] == n * r
    return lines


def test_custom_env_discovered_and_evaluated(custom_env, tmp_path, monkeypatch, capsys) -> None:
    with FakeOpenAIServer() as server:
        code, output = run_cli(
            monkeypatch, capsys, "eval", custom_env, "-m", "fake-model", "-b", server.url,
            "-n", "4", "-r", "3", "-T", "0.5", "-o", str(tmp_path / "out"),
        )  # fmt: skip
    assert code == 0, output
    run_dir = only_run_dir(tmp_path / "out")
    lines = check_complete_run(run_dir, n=4, r=3)
    assert all(rec["reward"] == 1.0 for rec in lines)
    assert server.requests[0]["temperature"] == 0.5 and server.requests[0]["max_tokens"] == 64
    assert "pass@2" in output and "avg@3" in output
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["env_id"] == custom_env and metadata["model"] == "fake-model"
    assert metadata["sampling"] == {"max_tokens": 64, "temperature": 0.5}
    assert metadata["summary"]["pass_at_k"]["pass@3"] == 1.0

    code, output = run_cli(monkeypatch, capsys, "eval", "show", str(run_dir), "--samples", "2")
    assert code == 0
    assert "example 0 rollout 1" in output and "example 1 rollout 0" not in output
    assert "reward mean" in output


def test_retries_on_429_and_500_are_invisible_in_results(custom_env, tmp_path) -> None:
    from rlkit.eval import EvalConfig, run_eval

    script = [429, 500, 429, 503]
    with FakeOpenAIServer(script=script, fail_rate=0.3, seed=3) as server:
        config = EvalConfig(
            env_id=custom_env, model="fake-model", base_url=server.url, num_examples=6,
            rollouts_per_example=2, max_retries=8, output_dir=tmp_path / "out",
        )  # fmt: skip
        # the client's backoff starts at 0.5 s; failures here are few, so the test stays short
        run_dir = run_eval(config)
    assert server.stats[429] >= 2 and server.stats[500] + server.stats[503] >= 2
    assert server.stats[200] == 12
    check_complete_run(run_dir, n=6, r=2)


def test_failures_are_recorded_then_resume_reruns_them(custom_env, tmp_path, monkeypatch, capsys):
    with FakeOpenAIServer(fail_rate=1.0, fail_statuses=[500]) as server:
        code, output = run_cli(
            monkeypatch, capsys, "eval", custom_env, "-m", "fake-model", "-b", server.url,
            "-n", "3", "-r", "2", "--max-retries", "0", "-o", str(tmp_path / "out"),
        )  # fmt: skip
        assert code == 1, output  # after the summary, which groups the errors by cause
        assert "errored rollouts 6 of 6: generation failed (HTTP 500)" in output
        run_dir = only_run_dir(tmp_path / "out")
        run = load_run(run_dir)
        assert len(run.results) == 6 and all("HTTP 500" in r.rollout.error for r in run.results)
        assert run.metadata.summary["errors"] == 6

        # a changed sampling configuration is refused and leaves the run untouched
        code, output = run_cli(
            monkeypatch, capsys, "eval", "--resume", str(run_dir), "-T", "0.9", "-b", server.url
        )
        assert code == 2 and "temperature: run has None, now 0.9" in output

        server.fail_rate = 0.0
        code, output = run_cli(monkeypatch, capsys, "eval", "--resume", str(run_dir))
    assert code == 0, output
    assert server.stats[200] == 6
    check_complete_run(run_dir, n=3, r=2)


@pytest.mark.slow  # runs the CLI as a subprocess twice
def test_sigint_then_resume_gives_exactly_n_times_r(custom_env, tmp_path) -> None:
    n, r = 30, 2
    with FakeOpenAIServer(latency=0.25) as server:
        cmd = [
            RLKIT, "eval", custom_env, "-m", "fake-model",
            "-b", server.url, "-n", str(n), "-r", str(r), "-c", "4", "-o", str(tmp_path / "out"),
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                results = list(tmp_path.glob("out/*/results.jsonl"))
                if results and len(results[0].read_text().splitlines()) >= 8:
                    break
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err.decode()
        assert "rlkit eval --resume" in err.decode()
        run_dir = only_run_dir(tmp_path / "out")
        interrupted = load_run(run_dir)
        assert interrupted.metadata.status == "interrupted"
        assert 8 <= len(interrupted.results) < n * r

        resumed = subprocess.run(
            [RLKIT, "eval", "--resume", str(run_dir), "-c", "32"],
            capture_output=True, timeout=120,
        )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert f"{n * r - len(interrupted.results)} rollouts to run" in resumed.stderr.decode()
    check_complete_run(run_dir, n=n, r=r)


def test_unreachable_url_unknown_model_unknown_env_exit_2(custom_env, monkeypatch, capsys):
    from rlkit.inference import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    code, output = run_cli(monkeypatch, capsys, "eval", custom_env, "-m", "x", "-b", dead)
    assert code == 2 and "cannot reach" in output and "-b/--base-url" in output

    with FakeOpenAIServer() as server:
        code, output = run_cli(
            monkeypatch, capsys, "eval", custom_env, "-m", "fake-modle", "-b", server.url
        )
    assert code == 2 and "is not served" in output and "fake-model" in output
    assert server.stats[200] == 0

    code, output = run_cli(monkeypatch, capsys, "eval", "word-flp", "-m", "x", "-b", dead)
    assert code == 2 and "unknown environment" in output and "word-flip" in output


def test_reverse_text_end_to_end(tmp_path, monkeypatch, capsys) -> None:
    with FakeOpenAIServer() as server:  # replies with the last user message reversed
        code, output = run_cli(
            monkeypatch, capsys, "eval", "reverse-text", "-m", "fake-model", "-b", server.url,
            "-n", "5", "-r", "2", "-t", "32", "-o", str(tmp_path),
        )  # fmt: skip
    assert code == 0, output
    run_dir = only_run_dir(tmp_path)
    lines = check_complete_run(run_dir, n=5, r=2)
    assert all(rec["reward"] == 1.0 for rec in lines)
    assert all(body["max_tokens"] == 32 and body["logprobs"] for body in server.requests)
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["env_version"]  # the installed package's version


def test_math_end_to_end(tmp_path, monkeypatch, capsys) -> None:
    from rlkit.envs import load_environment

    rows = load_environment("math", dataset="aime25").get_eval_dataset(4)
    answers = {row["prompt"][-1]["content"]: row["answer"] for row in rows}

    def solve(body: dict) -> str:
        question = body["messages"][-1]["content"]
        return f"<think>Known problem.</think>The answer is $\\boxed{{{answers[question]}}}$."

    with FakeOpenAIServer(responder=solve) as server:
        code, output = run_cli(
            monkeypatch, capsys, "eval", "math", "-a", '{"dataset": "aime25"}', "-m", "fake-model",
            "-b", server.url, "-n", "4", "-r", "2", "-o", str(tmp_path),
        )  # fmt: skip
    assert code == 0, output
    lines = check_complete_run(only_run_dir(tmp_path), n=4, r=2)
    assert [rec["reward"] for rec in lines] == [1.0] * 8
    assert all(rec["metrics"]["boxed_answer"] == 1.0 for rec in lines)


@pytest.mark.slow  # builds a wheel in a subprocess
def test_push_adds_the_run_to_the_hub_leaderboard(custom_env, tmp_path, monkeypatch, capsys):
    from rlkit.hub import LocalHub, build_env

    env_dir = Path(os.environ["RLKIT_ENV_PATH"]) / custom_env
    (env_dir / "README.md").write_text("# word-flip\n")
    hub = LocalHub(tmp_path / "hub", owner="alice")
    hub.push(build_env(env_dir, isolation=False))
    with FakeOpenAIServer() as server:
        args = ["-m", "fake-model", "-b", server.url, "-n", "2", "-r", "2", "--push"]
        code, output = run_cli(
            monkeypatch, capsys, "eval", f"alice/{custom_env}@0.1.0", *args,
            "--hub", str(tmp_path / "hub"), "-o", str(tmp_path / "out"),
        )  # fmt: skip
    assert code == 0, output
    assert "pushed:" in output
    card = json.loads((tmp_path / "hub" / "projects" / f"{custom_env}.json").read_text())
    (record,) = card["evals"]
    assert record["model"] == "fake-model" and record["mean_reward"] == 1.0 and record["n"] == 4


def test_package_eval_defaults_apply_below_flags(custom_env, tmp_path, monkeypatch, capsys):
    pyproject = Path(os.environ["RLKIT_ENV_PATH"]) / custom_env / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "word-flip"\nversion = "0.1.0"\n\n'
        "[tool.rlkit.eval]\nnum_examples = 3\nrollouts_per_example = 2\n\n"
        "[tool.rlkit.eval.sampling]\ntemperature = 0.7\nmax_tokens = 16\n"
    )
    with FakeOpenAIServer() as server:
        args = ["-m", "fake-model", "-b", server.url, "-o", str(tmp_path / "out")]
        code, output = run_cli(monkeypatch, capsys, "eval", custom_env, *args, "-T", "0.1")
        assert code == 0, output
        check_complete_run(only_run_dir(tmp_path / "out"), n=3, r=2)
        assert {(b["temperature"], b["max_tokens"]) for b in server.requests} == {(0.1, 16)}

        pyproject.write_text(pyproject.read_text() + "\n[tool.rlkit.eval.oops]\n")
        code, output = run_cli(monkeypatch, capsys, "eval", custom_env, *args)
    assert code == 2 and "unknown keys ['oops']" in output


def test_config_file_and_dotted_overrides(custom_env, tmp_path, monkeypatch, capsys) -> None:
    """`rlkit eval --config FILE` plus `--section.field VALUE`, the same convention as train."""
    with FakeOpenAIServer() as server:
        config = tmp_path / "eval.toml"
        config.write_text(
            f'env_id = "{custom_env}"\nmodel = "fake-model"\nbase_url = "{server.url}"\n'
            f'num_examples = 2\nrollouts_per_example = 1\noutput_dir = "{tmp_path / "out"}"\n'
        )
        code, output = run_cli(
            monkeypatch, capsys, "eval", "--config", str(config), "-r", "2",
            "--env_args.system_prompt", "Reverse it.", "--sampling.max_tokens", "8",
        )  # fmt: skip
    assert code == 0, output
    check_complete_run(only_run_dir(tmp_path / "out"), n=2, r=2)
    assert {request["messages"][0]["content"] for request in server.requests} == {"Reverse it."}
    assert {request["max_tokens"] for request in server.requests} == {8}
