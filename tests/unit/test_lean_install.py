"""The base package works without the trainer (issue 66 item 5): every command an evaluator or
environment author runs (`rlkit eval`, `env init / check / build / push`, `eval show`) runs as a
CLI process in which torch, transformers and peft cannot be imported (as in a venv with
`pip install rlkit` alone), and never tries to import them; a trainer command (`train`, `sft`,
`infer`, `model`, and `simulate`, whose training config loads the weight transports) says which
extra to install. tests/integration/test_lean_venv.py does the same in a real fresh
venv with the base wheel only, and installs an environment from a hub there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.slow  # a dozen CLI processes

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ("torch", "transformers", "peft")
# `rlkit ARGS` where the trainer's packages cannot be found, as when they are not installed: the
# path finder answers None for them (`import torch` raises ModuleNotFoundError,
# importlib.util.find_spec says None, "torch" stays out of sys.modules); every import of them
# (not a find_spec query: datasets asks whether torch exists) is reported on stderr at exit
WITHOUT_TRAINER = f"""
import atexit, importlib.machinery, sys
BLOCKED = {TRAINER!r}
tried = set()
class WithoutTrainer(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] not in BLOCKED:
            return super().find_spec(name, path, target)
        frame, query = sys._getframe(1), False
        for _ in range(6):
            if frame is None:
                break
            query = query or "importlib.util" in frame.f_code.co_filename \
                or frame.f_code.co_filename.endswith("importlib/util.py")
            frame = frame.f_back
        if not query:
            tried.add(name)
        return None
sys.meta_path[:] = [
    WithoutTrainer if f is importlib.machinery.PathFinder else f for f in sys.meta_path
]
atexit.register(lambda: tried and sys.stderr.write("TRIED TO IMPORT " + " ".join(sorted(tried))))
sys.argv = ["rlkit", *sys.argv[1:]]
from rlkit_cli.main import main
main()
"""


def lean(*args: str, cwd: Path, env: dict[str, str], expect: int = 0) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRAINER, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert "TRIED TO IMPORT" not in out, f"rlkit {' '.join(args)}:\n{out[-3000:]}"
    assert done.returncode == expect, f"rlkit {' '.join(args)} -> {done.returncode}:\n{out[-3000:]}"
    return out


def add_numbers(body: dict[str, Any]) -> str:
    a, b = map(int, re.findall(r"\d+", body["messages"][-1]["content"])[:2])
    return str(a + b)


def test_base_commands_run_without_torch_transformers_peft(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "RLKIT_HOME": str(tmp_path / "home"),
        "RLKIT_HUB": "",
        "RLKIT_HUB_OWNER": "alice",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")]),
    }
    env.pop("RLKIT_ENV_PATH", None)
    assert "Commands:" in lean("--help", cwd=tmp_path, env=env)
    lean("env", "init", "adder-env", cwd=tmp_path, env=env)
    lean("env", "init", "tool-env", "--template", "tool", cwd=tmp_path, env=env)
    for package in ("adder-env", "tool-env"):
        assert "OK" in lean("env", "check", f"./{package}", "--gold", cwd=tmp_path, env=env)
    lean("env", "build", "./adder-env", "--no-isolation", cwd=tmp_path, env=env)
    pushed = lean("env", "push", "./adder-env", cwd=tmp_path, env=env)
    assert "alice/adder-env@0.1.0" in pushed
    with FakeOpenAIServer(responder=add_numbers) as fake:
        for package in ("adder-env", "tool-env"):
            lean(
                "eval", f"./{package}", "-m", "fake-model", "--base-url", fake.url,
                "-n", "2", "-r", "1", "-o", str(tmp_path / "runs" / package),
                cwd=tmp_path, env=env,
            )  # fmt: skip
    (run_dir,) = (tmp_path / "runs" / "adder-env").iterdir()
    assert "reward 1.0000" in lean("eval", "show", str(run_dir), cwd=tmp_path, env=env)


@pytest.mark.parametrize(
    "command",
    [
        ["train", "examples/tiny-cpu/train.toml"],
        ["sft", "examples/sft_tiny/sft.toml"],
        ["infer", "-m", "some/model"],
        ["model", "init-tiny", "-o", "/nonexistent/tiny"],
        ["simulate", "examples/simulate/ring1t.toml"],  # a training config: weight transports
    ],
)
def test_trainer_commands_name_the_extra(command: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    out = lean(*command, cwd=ROOT, env=env, expect=1)
    assert "pip install 'rlkit[train]'" in out and "missing: torch, transformers, peft" in out
