"""Each `rlkit train --role` validates and loads only what it needs: a trainer or inference node
never loads the environments (their datasets may be unreachable from it), the orchestrator does,
and it also checks that the `[log]` backends it will write to are installed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

CONFIG = """
[model]
path = "/nonexistent/model"
[[env]]
id = "math"
args = { dataset = "some-org/a-hub-dataset-that-is-not-here" }
[orchestrator]
schedulers.c3po.token_budget = 512
sampling = { max_tokens = 64 }
"""


@pytest.mark.parametrize("role", ["trainer", "inference", "sandbox"])
def test_trainer_and_inference_dry_runs_do_not_load_the_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, role: str
) -> None:
    path = tmp_path / "train.toml"
    path.write_text(CONFIG)
    code, out = run_cli(monkeypatch, capsys, "train", str(path), "--role", role, "--dry-run")
    assert code in (0, None)
    assert tomllib.loads(out)["env"][0]["id"] == "math"  # the resolved config, nothing else


def test_the_orchestrator_dry_run_loads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "train.toml"
    path.write_text(CONFIG)
    code, output = run_cli(
        monkeypatch, capsys, "train", str(path), "--role", "orchestrator", "--dry-run"
    )
    assert code == 2 and "env.0" in output and "a-hub-dataset-that-is-not-here" in output


def test_the_orchestrator_refuses_a_logger_that_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    path = tmp_path / "train.toml"
    path.write_text(CONFIG)
    code, output = run_cli(
        monkeypatch, capsys, "train", str(path), "--log.mlflow=true", "--dry-run"
    )
    assert code == 2 and "log.mlflow = true needs the mlflow package" in output


def test_a_sandbox_node_needs_sandbox_serve_and_no_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`--role sandbox` serves this node's sandbox service for the run: without `[sandbox]
    serve` it refuses in one line, before anything is written (the model is never read)."""
    path = tmp_path / "train.toml"
    path.write_text(CONFIG)
    run_dir = tmp_path / "run"
    code, output = run_cli(
        monkeypatch, capsys, "train", str(path), "--role", "sandbox", f"--log.run_dir={run_dir}"
    )
    assert code == 2 and "sandbox.serve" in output and not run_dir.exists()
    code, output = run_cli(
        monkeypatch,
        capsys,
        *("train", str(path), "--role", "sandbox", f"--log.run_dir={run_dir}"),
        "--sandbox.serve=true",
    )
    assert code == 2 and "sandbox.serve_port" in output and not run_dir.exists()
