"""Refusals before anything starts (issue 66 item 3), as a user meets them: `rlkit train` of a
model whose tokenizer has no chat template exits 2 naming the fix, before any server starts,
and leaves no run directory behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import DEMO_CONFIG, RLKIT

pytestmark = pytest.mark.slow  # a CLI subprocess that loads the environments


def test_a_model_without_a_chat_template_is_refused_up_front(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "base-model"
    subprocess.run(["cp", "-r", str(tiny_model_dir), str(model)], check=True)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))

    run_dir = tmp_path / "run"
    done = subprocess.run(
        [RLKIT, "train", str(DEMO_CONFIG), f"--model.path={model}", f"--log.run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "has no chat template" in out and "chat_template.jinja" in out
    assert "vllm" not in out.lower() and not run_dir.exists()
