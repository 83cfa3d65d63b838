"""Row shapes verifiers accepts, through `rlkit eval` over the bridge, against verifiers itself.

vf-string-prompt's rows hold plain-string prompts. verifiers 0.2.0 and 0.3.1 turn each into one
user message and score the replies; the same replies through `rlkit eval` must score exactly
what verifiers' own `env.evaluate` computes in the same bridge venv (tests/integration/
vf_reference.py). verifiers 0.1.x chat environments reject a string prompt (an assertion in
its rollout); there rlkit must not crash either: every rollout errors with a message naming the
row and the field, as verifiers' own evaluation errors every rollout. verifiers 0.4 tasksets
(vf-calc-v04's tasks hold string prompts) are compared with 0.4's own `vf-eval`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlkit.envs.bridge.venvs import ensure_venv
from tests.helpers.cli import clean_rollouts, only_run_dir, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.scripted_replies import calculator, say_word

pytestmark = pytest.mark.venv

ENVS = Path(__file__).parent / "envs"
REFERENCE = Path(__file__).parent / "vf_reference.py"
NUM_EXAMPLES = 4


def _rlkit_eval(monkeypatch, capsys, tmp_path: Path, url: str, version: str) -> Path:
    monkeypatch.setenv("RLKIT_ENV_PATH", str(ENVS))
    out = tmp_path / "runs"
    code, text = run_cli(
        monkeypatch, capsys, "eval", "vf-string-prompt", "-m", "fake-model", "-b", url,
        "-n", str(NUM_EXAMPLES), "-r", "1", "-t", "256", "-o", str(out),
        "--verifiers-version", version, "--allow-errors",
    )  # fmt: skip
    assert code in (0, None), text
    return out


def _reference(version: str, url: str) -> list[dict] | str:
    """verifiers' own evaluation of the fixture, in the bridge venv rlkit used: one record per
    example, or the error output when verifiers' evaluation itself raised."""
    python = ensure_venv("vf-string-prompt", version, ["datasets>=3.0"])
    done = subprocess.run(
        [str(python), str(REFERENCE), "vf_string_prompt", str(ENVS / "vf-string-prompt"), url,
         str(NUM_EXAMPLES)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": "", "RLKIT_REFERENCE_KEY": "EMPTY", "TQDM_DISABLE": "1"},
    )  # fmt: skip
    if done.returncode != 0:
        return done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rlkit_and_reference(monkeypatch, capsys, tmp_path: Path, version: str):
    """The same replies through `rlkit eval` and through verifiers' own evaluation."""
    with FakeOpenAIServer(responder=say_word) as server:
        out = _rlkit_eval(monkeypatch, capsys, tmp_path, server.url, version)
        return out, _reference(version, server.url)


@pytest.mark.parametrize("version", ["0.2.0", "0.3.1"])
def test_string_prompts_score_as_verifiers_scores_them(
    monkeypatch, capsys, tmp_path, version
) -> None:
    out, reference = _rlkit_and_reference(monkeypatch, capsys, tmp_path, version)
    rollouts = sorted(clean_rollouts(out, expected=NUM_EXAMPLES), key=lambda r: r.example_id)
    assert [r.prompt for r in rollouts] == [
        [{"role": "user", "content": f"Say the word: {w}"}]
        for w in ("apple", "river", "stone", "cloud")
    ]
    assert isinstance(reference, list), reference[-3000:]
    assert [ref["error"] for ref in reference] == [None] * NUM_EXAMPLES
    assert [r.reward for r in rollouts] == pytest.approx([ref["reward"] for ref in reference])
    assert [r.reward for r in rollouts] == pytest.approx([1.5, 1.1, 1.5, 1.1])  # both rewards


@pytest.mark.parametrize("version", ["0.1.3.post0", "0.1.9.post3"])
def test_string_prompts_under_0_1_error_naming_row_and_field(
    monkeypatch, capsys, tmp_path, version
) -> None:
    from rlkit.eval import load_run

    out, reference = _rlkit_and_reference(monkeypatch, capsys, tmp_path, version)
    run = load_run(only_run_dir(out))
    errors = sorted((r.rollout.example_id, r.rollout.error) for r in run.results)
    assert len(errors) == NUM_EXAMPLES
    for index, (example_id, error) in enumerate(errors):
        assert f"eval row {index} (example_id {example_id}): field 'prompt' is text" in error
        assert f"verifiers {version} chat environments take a list of messages" in error
    # verifiers' own evaluation fails on these rows too: 0.1.3 raises out of `evaluate`, 0.1.9
    # records each rollout's error (an AssertionError on the prompt) and scores it 0
    if isinstance(reference, str):
        assert "assert isinstance(prompt, list)" in reference, reference[-3000:]
    else:
        assert all(ref["reward"] == 0.0 and ref["error"] for ref in reference), reference


def calculator_wrong_past_8(body: dict) -> str | dict:
    """Calls `add` like `calculator`, then misstates every sum above 8 (so rewards differ)."""
    last = body["messages"][-1]
    if last["role"] == "tool" and int(last["content"]) > 8:
        return "The sum is 0."
    return calculator(body)


def test_0_4_taskset_string_prompts_score_as_verifiers_scores_them(
    monkeypatch, capsys, tmp_path
) -> None:
    """vf-calc-v04's tasks hold string prompts (and a system prompt); `rlkit eval` must score
    them as verifiers 0.4's own `vf-eval` does (its chat agent, subprocess runtime)."""
    monkeypatch.setenv("RLKIT_ENV_PATH", str(ENVS))
    out = tmp_path / "runs"
    with FakeOpenAIServer(responder=calculator_wrong_past_8) as server:
        code, text = run_cli(
            monkeypatch, capsys, "eval", "vf-calc-v04", "-m", "fake-model", "-b", server.url,
            "-n", "4", "-r", "1", "-o", str(out),
        )  # fmt: skip
        assert code in (0, None), text
        venv_bin = ensure_venv("vf-calc-v04", "0.4.0", ["uv"]).parent
        done = subprocess.run(
            [str(venv_bin / "vf-eval"), "vf_calc_v04", "-m", "fake-model", "--no-push",
             "-o", str(tmp_path / "vf"), "--client.base-url", server.url,
             "--client.api-key-var", "RLKIT_REFERENCE_KEY", "--env.agent.runtime.type",
             "subprocess", "--env.agent.harness.id", "null"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ENVS / "vf-calc-v04"), "TQDM_DISABLE": "1",
                 "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
                 "RLKIT_REFERENCE_KEY": "EMPTY"},
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (traces,) = (tmp_path / "vf").glob("*/traces.jsonl")
    reference = {}
    for line in traces.read_text().splitlines():
        episode = json.loads(line)
        assert episode["ok"], episode["errors"]
        rewards = [r for t in episode["traces"] for r in t["rewards"].values()]
        reference[episode["task"]["data"]["idx"]] = sum(r["score"] * r["weight"] for r in rewards)
    rollouts = clean_rollouts(out, expected=4)
    ours = {r.example_id: r.reward for r in rollouts}
    assert ours == pytest.approx(reference) and sorted(ours.values()) == [0.0, 0.0, 1.0, 1.0]
    assert rollouts[0].prompt[-1] == {"role": "user", "content": "What is 2 + 1?"}
