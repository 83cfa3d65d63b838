"""`rlkit env check` and `rlkit env doctor` on verifiers environments: scripted replies through
the bridge worker.

The scripts are served over HTTP to the worker (`rlkit.envs.scripted_server`), so verifiers'
own rollout loop and rubric score them. Gold answers come from the fixtures' rows
(`info["gold_completion"]`): a single reply (vf-string-prompt, 0.3.1 by its range) or a tool call
then the answer (vf-calc-v03). vf-broken-reward's reward ignores the reply, so garbage scores the
maximum and the check fails with exit 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import bridge_workers, run_cli

pytestmark = pytest.mark.venv

ENV_PATH = str(Path(__file__).parent / "envs")


def _check(monkeypatch, capsys, *args: str):
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    return run_cli(monkeypatch, capsys, "env", "check", *args)


@pytest.mark.parametrize(
    "args",
    [("vf-string-prompt",), ("vf-string-prompt", "--verifiers-version", "0.2.0"), ("vf-calc-v03",)],
)
def test_env_check_passes_with_gold_on_bridged_envs(monkeypatch, capsys, args) -> None:
    code, text = _check(monkeypatch, capsys, *args, "--gold", "-n", "3")
    assert code == 0, text
    for kind in ("gold", "empty", "garbage"):
        assert f"{kind}: 3/3 as expected" in text, text
    assert text.rstrip().endswith("OK")
    assert bridge_workers() == []  # the check closed the environment it loaded


def test_env_check_fails_on_a_broken_bridged_env(monkeypatch, capsys) -> None:
    code, text = _check(monkeypatch, capsys, "vf-broken-reward", "-n", "2")
    assert code == 1, text
    assert "garbage: 0/2 as expected" in text
    assert "FAIL row 0 [garbage] task=default: reward 1, expected 0" in text


def test_doctor_reports_each_stage_of_an_off_template_package(monkeypatch, capsys) -> None:
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    code, text = run_cli(monkeypatch, capsys, "env", "doctor", "vf-odd-layout", "-n", "2")
    assert code == 0, text
    for line in (
        "ok   verifiers requirement: verifiers<0.3,>=0.2",
        "ok   era: 0.1.10-0.2.x client layer: runs with verifiers 0.2.0",
        "ok   entry point: module odd_tasks.envs.echo: load_environment",
        "ok   load: SingleTurnEnv (single-turn); rows: train None, eval 3",
        "ok   scripted garbage replies: 2/2 ran, 2 scored the expected 0",
        "vf-odd-layout: runs through the bridge",
    ):
        assert line in text, text


def test_doctor_fails_where_verifiers_rejects_the_rows(monkeypatch, capsys) -> None:
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    args = ["vf-string-prompt", "--verifiers-version", "0.1.9.post3", "-n", "1"]
    code, text = run_cli(monkeypatch, capsys, "env", "doctor", *args)
    assert code == 1, text
    assert "ok   era: 0.1.x classic: runs with verifiers 0.1.9.post3" in text
    assert "FAIL scripted empty replies: 0/1 ran" in text
    assert "field 'prompt' is text" in text.replace("\n", " ")
    assert "vf-string-prompt: does not run as is" in text
