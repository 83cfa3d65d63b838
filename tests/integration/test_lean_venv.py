"""A teammate who only evaluates installs the base package alone (issue 66 item 5): in a fresh
venv with `pip install rlkit` (this tree's wheel, no extra) there is no torch, transformers or
peft, and `rlkit env push` / `env install` (from a hub), `rlkit eval` against an
OpenAI-compatible server, and a tool environment's `env check --gold` work; `rlkit train` names
the extra to install. The venv is built with uv from its cache (seconds; as the verifiers bridge
builds its venvs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlkit.envs.bridge.venvs import find_uv
from tests.helpers.fake_openai import FakeOpenAIServer

pytestmark = [pytest.mark.slow, pytest.mark.venv]

ROOT = Path(__file__).resolve().parents[2]
PROJECT_CLI = [sys.executable, "-c", "from rlkit_cli.main import main; main()"]


def add_numbers(body: dict[str, Any]) -> str:
    a, b = map(int, re.findall(r"\d+", body["messages"][-1]["content"])[:2])
    return str(a + b)


def base_wheel(tmp_path: Path) -> Path:
    """This tree's rlkit as a wheel, built from a copy (the shared tree gets no build/ folder)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("rlkit", "cli"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "wheel"), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheel").glob("rlkit-*.whl")
    return wheel


def test_base_install_evaluates_and_installs_from_a_hub(tmp_path: Path) -> None:
    venv, wheel = tmp_path / "lean", base_wheel(tmp_path)
    python = str(venv / "bin" / "python")
    started = time.monotonic()
    uv = find_uv()
    # --seed: pip too, as a user's venv has (`rlkit env install` runs it)
    seeded = [uv, "venv", "-q", "--seed", "--python", sys.executable, str(venv)]
    subprocess.run(seeded, check=True)
    install = [uv, "pip", "install", "-q", "--python", python, str(wheel)]
    installed = subprocess.run(install, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    print(f"base install: {time.monotonic() - started:.0f} s")
    absent = subprocess.run(
        [python, "-c", "import importlib.util as u; "
         "print([m for m in ('torch', 'transformers', 'peft') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert absent.stdout.strip() == "[]"

    env = {
        **os.environ,
        "RLKIT_HOME": str(tmp_path / "home"),
        "RLKIT_HUB": "",
        "RLKIT_HUB_OWNER": "alice",
    }
    for var in ("RLKIT_ENV_PATH", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(var, None)
    lean_cli = [str(venv / "bin" / "rlkit")]

    def run(cli: list[str], *args: str, expect: int = 0) -> str:
        done = subprocess.run(
            [*cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        out = done.stdout + done.stderr
        assert done.returncode == expect, f"rlkit {' '.join(args)} -> {done.returncode}:\n{out}"
        return out

    # the author (the project venv) builds; the lean venv publishes, installs and evaluates
    run(PROJECT_CLI, "env", "init", "adder-env")
    run(PROJECT_CLI, "env", "build", "./adder-env", "--no-isolation")
    assert "alice/adder-env@0.1.0" in run(lean_cli, "env", "push", "./adder-env")
    run(lean_cli, "env", "install", "alice/adder-env")
    shutil.rmtree(tmp_path / "adder-env")  # the installed copy is what `eval` finds
    with FakeOpenAIServer(responder=add_numbers) as fake:
        out = run(
            lean_cli, "eval", "alice/adder-env", "-m", "fake-model", "--base-url", fake.url,
            "-n", "3", "-r", "2", "-o", str(tmp_path / "runs"),
        )  # fmt: skip
    assert re.search(r"reward\s+1\.0", out), out

    run(lean_cli, "env", "init", "calc-env", "--template", "tool")  # tool schemas: no transformers
    assert "gold: 10/10 as expected" in run(lean_cli, "env", "check", "./calc-env", "--gold")
    refused = run(lean_cli, "train", str(ROOT / "examples/tiny-cpu/train.toml"), expect=1)
    assert "pip install 'rlkit[train]'" in refused
