"""`rlkit env init` / `build`: the scaffold is a working, buildable, tested environment package."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.hub import build_env, dist_files, init_env
from rlkit.hub.artifacts import inspect_artifact

CLI = [sys.executable, "-c", "from rlkit_cli.main import main; main()"]


def test_init_writes_a_complete_package(tmp_path: Path) -> None:
    root = init_env("my-env", tmp_path, "Adds numbers.")
    assert root == tmp_path / "my-env"
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == "my-env" and project["project"]["version"] == "0.1.0"
    assert "rlkit" in project["project"]["dependencies"] and project["project"]["keywords"]
    assert project["tool"]["rlkit"]["eval"]["rollouts_per_example"] >= 1
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    for rel in [
        "README.md",
        "my_env/__init__.py",
        "my_env/train.jsonl",
        "my_env/eval.jsonl",
        "tests/test_my_env.py",
    ]:
        assert (root / rel).is_file(), rel
    with pytest.raises(UsageError, match="not empty"):
        init_env("my-env", tmp_path)
    with pytest.raises(UsageError, match="invalid environment name"):
        init_env("../escape", tmp_path)


@pytest.mark.slow  # builds the package, runs its tests
def test_scaffold_builds_loads_and_passes_its_tests(tmp_path: Path) -> None:
    root = init_env("my-env", tmp_path)
    files = build_env(root, isolation=False)
    assert sorted(f.suffix for f in files) == [".gz", ".whl"] and dist_files(root) == files
    wheel = next(f for f in files if f.suffix == ".whl")
    info = inspect_artifact(wheel.read_bytes(), wheel.name)
    assert info.keywords == ["rlkit-env", "single-turn", "arithmetic"]
    assert info.readme.startswith("# my-env") and "rlkit" in info.requires_dist
    env = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert env.returncode == 0, env.stdout + env.stderr


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    bad = subprocess.run(
        [*CLI, "env", "init", "bad/name", "-p", str(tmp_path)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "invalid environment name" in bad.stderr
    missing = subprocess.run(
        [*CLI, "env", "build", str(tmp_path / "nowhere")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no pyproject.toml" in missing.stderr


@pytest.mark.slow  # CLI processes; runs the scaffold's own tests
def test_tool_template_is_a_multi_turn_tool_env_that_passes_its_tests(tmp_path: Path) -> None:
    """`rlkit env init NAME --template tool`: a ToolEnv whose gold rollout calls the tool and
    then answers (two model turns), checked by `env check --gold` and by its own tests."""
    made = subprocess.run(
        [*CLI, "env", "init", "calc-env", "--template", "tool", "-p", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    root = tmp_path / "calc-env"
    source = (root / "calc_env" / "__init__.py").read_text()
    assert "ToolEnv" in source and "def calculate(expression: str)" in source
    keywords = tomllib.loads((root / "pyproject.toml").read_text())["project"]["keywords"]
    assert "tool-use" in keywords and "multi-turn" in keywords
    checked = subprocess.run(
        [*CLI, "env", "check", str(root), "--gold"], capture_output=True, text=True
    )
    assert checked.returncode == 0 and "gold: 10/10 as expected" in checked.stdout, checked
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0 and "4 passed" in tests.stdout, tests.stdout + tests.stderr
    unknown = subprocess.run(
        [*CLI, "env", "init", "x-env", "--template", "chat", "-p", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 2 and "single-turn, tool" in unknown.stderr
    assert not (tmp_path / "x-env").exists()
