"""A third-party verifiers environment from the package index, through the `rlkit` CLI.

`sophistry-bench-sprint` 0.1.6 (not ours: a reward-hacking study published to the index) is a
single-turn `vf.SingleTurnEnv` that declares `verifiers>=0.1.14` and ships its data (50 QuALITY
passages) inside the wheel, so it runs with no network beyond the model endpoint. The test
fetches the pinned wheel (sha256 checked) once into `.cache/wheels`, then works offline:
`rlkit env install NAME@VERSION --find-links` puts it into a fresh venv without verifiers, and
`rlkit eval` there runs it through the bridge with the verifiers version its range selects.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlkit.envs.bridge.venvs import COMPLETE, venv_dir
from rlkit.envs.bridge.versions import select_version
from rlkit.hub import LocalHub
from tests.helpers.cli import ROOT, clean_rollouts, run_cli
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.hub_http import fresh_venv, installed, run
from tests.helpers.system import require_system

pytestmark = [pytest.mark.venv, pytest.mark.system]

NAME, VERSION = "sophistry-bench-sprint", "0.1.6"
SHA256 = "55fa0e830b4b7c92bfb37d3fbb15b911ea15c19165788db0f39b1bdd13cdb474"
WHEELS = ROOT / ".cache" / "wheels"


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The folder holding the pinned wheel, fetched from the package index on first use."""
    wheel = WHEELS / f"{NAME.replace('-', '_')}-{VERSION}-py3-none-any.whl"
    if not wheel.is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        pins = WHEELS / f"{NAME}.txt"
        pins.write_text(f"{NAME}=={VERSION} --hash=sha256:{SHA256}\n")
        fetch = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        done = subprocess.run(
            [*fetch, "--disable-pip-version-check", "-d", str(WHEELS), "-r", str(pins)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        require_system(
            f"the package index (to fetch {NAME}=={VERSION} once into {WHEELS})",
            done.returncode == 0 and wheel.is_file(),
            f"pip download failed: {done.stderr.strip()[-500:]}",
        )
    return WHEELS


def advocate(body: dict[str, Any]) -> str:
    """Eight <claim>s, each with a verbatim <cite> of six words from the prompt's passage:
    the environment's claim-count cliff and citation grounding both score 1.0. Quotes hold no
    quote marks: verifiers 0.2 hands rubrics pydantic messages, which this environment reads
    with `str()`, so a quote mark in the reply comes back escaped and no longer verbatim."""
    system = body["messages"][0]["content"]
    passage = system.split("PASSAGE:\n", 1)[1].split("\n\nQUESTION:", 1)[0]
    words = passage.split()
    windows = (words[i : i + 6] for i in range(0, len(words) - 6, 6))
    quotes = [" ".join(w) for w in windows if not any(c in " ".join(w) for c in "'\"\\")][:8]
    return "".join(f"<claim>Point {i}.</claim><cite>{q}</cite>" for i, q in enumerate(quotes))


def test_index_package_installs_without_verifiers_and_runs_through_eval(
    wheels: Path, tmp_path: Path
) -> None:
    python = fresh_venv(tmp_path)
    done = run(["env", "install", f"{NAME}@{VERSION}", "--find-links", str(wheels)], python)
    assert f"installed {NAME}@{VERSION}" in done.stdout
    assert installed(python, NAME) == VERSION
    _no_verifiers_beside(python)

    out = tmp_path / "runs"
    with FakeOpenAIServer(responder=advocate) as server:
        args = ["eval", NAME, "-m", "fake-model", "-b", server.url, "-n", "2", "-r", "2"]
        run([*args, "-t", "1024", "-o", str(out)], python)
    rollouts = clean_rollouts(out, expected=4)
    for rollout in rollouts:
        (turn,) = rollout.turns
        assert turn.prompt_token_ids and turn.completion_token_ids
        assert len(turn.completion_logprobs) == len(turn.completion_token_ids)
        assert rollout.reward == pytest.approx(1.0)
        assert rollout.metrics["n_claims_metric"] == 8.0
        assert rollout.metrics["alternation_canary_reward"] == 1.0
    # example 0 defends the gold answer, example 1 a distractor (the package's own dataset)
    assert sorted(r.metrics["correctness_reward"] for r in rollouts) == [0.0, 0.0, 1.0, 1.0]
    # the worker ran in the venv of the newest tested verifiers inside the declared range
    chosen = select_version(NAME, ">=0.1.14", api="load_environment")
    assert (venv_dir(NAME, chosen, ["pydantic>=2.0", "datasets>=2.0"]) / COMPLETE).is_file()


def test_install_into_another_interpreter(wheels: Path, tmp_path: Path) -> None:
    """`--python`: the package lands in that interpreter's venv, not in the one running rlkit."""
    python = fresh_venv(tmp_path)
    args = ["env", "install", f"{NAME}@{VERSION}", "--find-links", str(wheels)]
    done = run([*args, "--python", python])
    assert f"installed {NAME}@{VERSION} into {python}" in done.stdout
    assert installed(python, NAME) == VERSION and installed(sys.executable, NAME) is None
    done = run([*args, "--python", str(tmp_path / "no-python")], expect=2)
    assert f"--python: {tmp_path / 'no-python'} is not an executable Python interpreter" in (
        done.stdout + done.stderr
    )


def _no_verifiers_beside(python: str) -> None:
    """The venv of `python` got no verifiers of its own: it lives in the bridge venv."""
    own_packages = list((Path(python).parents[1] / "lib").glob("python3.*/site-packages/*"))
    assert not [p.name for p in own_packages if p.name.startswith("verifiers")]


def test_hub_install_takes_the_same_path(wheels: Path, tmp_path: Path) -> None:
    """The same wheel pushed to a (directory) hub installs the same way: no dependencies."""
    hub = tmp_path / "hub"
    LocalHub(hub, owner="carol").push(list(wheels.glob("sophistry_bench_sprint-*.whl")))
    python = fresh_venv(tmp_path)
    run(["env", "install", f"carol/{NAME}@{VERSION}", "--hub", str(hub)], python)
    assert installed(python, NAME) == VERSION
    _no_verifiers_beside(python)


def test_index_install_usage_errors(monkeypatch, capsys, tmp_path: Path) -> None:
    empty = tmp_path / "wheels"
    empty.mkdir()
    offline = ["--find-links", str(empty)]
    code, text = run_cli(monkeypatch, capsys, "env", "install", "alice/x", *offline)
    assert code == 2 and "--find-links is for NAME from the package index" in text
    code, text = run_cli(monkeypatch, capsys, "env", "install", f"{NAME}@9.9.9", *offline)
    assert code == 2 and f"could not fetch {NAME}==9.9.9 in {empty}" in text


def test_doctor_fetches_from_the_index_into_a_scratch_folder(
    wheels: Path, monkeypatch, capsys
) -> None:
    """`rlkit env doctor NAME` on the package (not installed here): fetched without its
    dependencies into a scratch folder, run in its bridge venv, nothing installed beside rlkit."""
    args = ["env", "doctor", f"{NAME}@{VERSION}", "--find-links", str(wheels), "-n", "2"]
    code, text = run_cli(monkeypatch, capsys, *args)
    assert code == 0, text
    chosen = select_version(NAME, ">=0.1.14", api="load_environment")
    for line in (
        "ok   package: wheel from the folder",
        "ok   verifiers requirement: verifiers>=0.1.14",
        f"runs with verifiers {chosen}",
        f"ok   entry point: module {NAME.replace('-', '_')}: load_environment",
        "ok   load: SingleTurnEnv (single-turn); rows: train 100",
        "ok   scripted empty replies: 2/2 ran",
        f"{NAME}@{VERSION}: runs through the bridge",
    ):
        assert line in text, text
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version(NAME)


def test_eval_installs_an_index_package_with_consent(wheels: Path, tmp_path: Path) -> None:
    """`rlkit eval NAME` on a package found nowhere: an error that says how to install it;
    with `--install` (the user's consent) it is installed from the index, then run."""
    python = fresh_venv(tmp_path)
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}  # the index, from the cache
    out = tmp_path / "runs"
    with FakeOpenAIServer(responder=advocate) as server:
        args = ["eval", f"{NAME}@{VERSION}", "-m", "fake-model", "-b", server.url, "-n", "1"]
        args += ["-r", "1", "-t", "1024", "-o", str(out)]
        refused = run(args, python, env=offline, expect=2)
        assert "--install" in refused.stderr + refused.stdout
        assert installed(python, NAME) is None
        run([*args, "--install"], python, env=offline)
    assert installed(python, NAME) == VERSION
    _no_verifiers_beside(python)
    (rollout,) = clean_rollouts(out, expected=1)
    assert rollout.reward == pytest.approx(1.0)
