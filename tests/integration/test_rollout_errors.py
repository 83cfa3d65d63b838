"""What a researcher sees when rollouts error (issue 66), as they run it: `rlkit eval` of an
environment whose reward function raises on half the rows, against the session's vLLM server.

Checked: the eval ends with the grouped causes ("4 of 8: reward function 'picky' raised
ValueError") and exit status 1; `rlkit eval show --errors`, piped, prints every full message on
one line (a message longer than any terminal, never cut); `--resume --allow-errors` reruns the
errored rollouts and exits 0.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import RLKIT, only_run_dir
from tests.helpers.flaky_env import CAUSE, write_flaky_env

pytestmark = pytest.mark.slow


def rlkit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RLKIT, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )  # piped: what a CI log or `| less` gets


def test_errored_eval_groups_causes_exits_1_and_shows_full_messages(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    write_flaky_env(tmp_path / "flaky-env")
    server = ["-m", str(tiny_model_dir), "-b", f"{vllm_server.url}/v1"]
    token = ["--token-file", str(vllm_server.token_file)]
    done = rlkit(tmp_path, "eval", "./flaky-env", *server, *token, "-n", "4", "-r", "2", "-o", "ev")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"errored rollouts 4 of 8: {CAUSE}" in done.stdout
    assert "exit status 1: rollouts errored (--allow-errors exits 0)" in done.stderr
    run_dir = only_run_dir(tmp_path / "ev")
    assert f"rlkit eval show {run_dir.relative_to(tmp_path)} --errors" in done.stdout

    shown = rlkit(tmp_path, "eval", "show", str(run_dir), "--errors")
    assert shown.returncode == 0, shown.stderr
    full = [line for line in shown.stdout.splitlines() if line.endswith("x" * 300 + " END")]
    assert len(full) == 4, shown.stdout  # one uncut line per errored rollout
    assert all("example_id" in line and "rollout" in line for line in full)
    assert f"{CAUSE} (4):" in shown.stdout

    again = rlkit(tmp_path, "eval", "--resume", str(run_dir), *token, "--allow-errors")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "errored rollouts 4 of 8" in again.stdout
