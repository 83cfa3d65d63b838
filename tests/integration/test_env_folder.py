"""A new environment named by its folder, as a user runs it (issue 45): `rlkit env init NAME`
prints the next step; `./NAME` and the absolute path work for `env check`, `eval` (against the
session's vLLM server), `train`, `build`, `push` and `doctor`; a bare NAME next to the folder
says to name it by its path; the scaffold's own tests pass with pytest run from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import DEMO_CONFIG, RLKIT, clean_rollouts

pytestmark = pytest.mark.slow


def rlkit(cwd: Path, *args: str, expect: int = 0, env: dict | None = None) -> str:
    done = subprocess.run(
        [RLKIT, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    out = done.stdout + done.stderr
    assert done.returncode == expect, out
    return out


def test_a_scaffolded_folder_is_its_id_everywhere(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = rlkit(work, "env", "init", "my-env")
    assert "next: rlkit env check ./my-env --gold" in out
    folder = work / "my-env"

    for env_id in ("./my-env", str(folder)):
        out = rlkit(work, "env", "check", env_id, "--gold")
        assert "local folder" in out and "gold: 10/10 as expected" in out and "OK" in out
    out = rlkit(work, "env", "check", "my-env", expect=2)
    assert "named by its path: ./my-env" in out

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "tests")],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0 and "4 passed" in tests.stdout, tests.stdout + tests.stderr

    out = rlkit(
        work, "eval", "./my-env", "-m", str(tiny_model_dir), "-b", f"{vllm_server.url}/v1",
        "--token-file", str(vllm_server.token_file), "-n", "2", "-r", "1", "-o", "evals",
    )  # fmt: skip
    assert "results:" in out
    clean_rollouts(work / "evals", expected=2)

    out = rlkit(
        work, "train", str(DEMO_CONFIG), '--env=[{id = "./my-env"}]',
        f"--model.path={tiny_model_dir}", "--log.run_dir=run", "--dry-run",
    )  # fmt: skip
    assert 'id = "./my-env"' in out

    out = rlkit(work, "env", "doctor", "./my-env", expect=1)
    assert "local folder" in out and "rlkit env check ./my-env --gold" in out

    out = rlkit(work, "env", "build", "./my-env", "--no-isolation")
    assert "my_env-0.1.0-py3-none-any.whl" in out
    hub = {"RLKIT_HOME": str(tmp_path / "home"), "RLKIT_HUB_OWNER": "carol", "RLKIT_HUB": ""}
    out = rlkit(work, "env", "push", "./my-env", env=hub)
    assert "published carol/my-env@0.1.0" in out
