"""Published verifiers packages that do not follow `vf-init`'s layout, through `rlkit eval`.

vf-odd-layout keeps its code under `src/`, has no module named after the distribution
(`odd_tasks`), defines `load_environment` in a submodule (`odd_tasks.envs.echo`) and lists
verifiers only in an extra (`[vf]`). rlkit finds it by itself, or where `NAME:module` points.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import clean_rollouts, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.scripted_replies import say_word

pytestmark = pytest.mark.venv

ENV_PATH = str(Path(__file__).parent / "envs")


def _eval(monkeypatch, capsys, tmp_path: Path, url: str, env_id: str):
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    out = tmp_path / "runs"
    code, text = run_cli(
        monkeypatch, capsys, "eval", env_id, "-m", "fake-model", "-b", url,
        "-n", "3", "-r", "1", "-o", str(out),
    )  # fmt: skip
    return code, text, out


@pytest.mark.parametrize("env_id", ["vf-odd-layout", "vf-odd-layout:odd_tasks.envs.echo"])
def test_package_off_the_template_runs(monkeypatch, capsys, tmp_path, env_id) -> None:
    with FakeOpenAIServer(responder=say_word) as server:
        code, text, out = _eval(monkeypatch, capsys, tmp_path, server.url, env_id)
    assert code in (0, None), text
    rollouts = clean_rollouts(out, expected=3)
    assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0]


def test_wrong_module_and_unknown_name_say_where_rlkit_looked(monkeypatch, capsys, tmp_path):
    code, text, _ = _eval(
        monkeypatch, capsys, tmp_path, "http://127.0.0.1:9/v1", "vf-odd-layout:odd_tasks.nope"
    )
    assert code == 2 and "no module 'odd_tasks.nope' in" in text and "vf-odd-layout/src" in text
    code, text, _ = _eval(monkeypatch, capsys, tmp_path, "http://127.0.0.1:9/v1", "no-such-env-xyz")
    assert code == 2, text
    for part in (
        "Looked for: an installed distribution 'no-such-env-xyz'",
        "no_such_env_xyz_env",
        f"{ENV_PATH}/no-such-env-xyz",
        "no-such-env-xyz:package.module",
        "--install",
    ):
        assert part in text.replace("\n", " "), text
