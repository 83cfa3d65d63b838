"""The README's "Your first environment" walk-through, run verbatim (issue 45) in a fresh folder
against the session's vLLM server: every command exits 0 and the eval writes its run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, clean_rollouts

pytestmark = pytest.mark.slow


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- first-environment -->\n```bash\n(.*?)```", text, re.S)
    assert block, "README lost its first-environment block"
    return block.group(1)


def test_the_readme_first_environment_walkthrough_runs_as_written(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "MODEL": str(tiny_model_dir),
        "BASE_URL": f"{vllm_server.url}/v1",
        "TOKEN_FILE": str(vllm_server.token_file),
    }
    env.pop("RLKIT_ENV_PATH", None)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "next: rlkit env check ./my-env --gold" in out
    assert "gold: 10/10 as expected" in out and "4 passed" in out
    clean_rollouts(tmp_path / "evals", expected=8)
