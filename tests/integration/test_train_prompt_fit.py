"""`rlkit train` on math-python with GSM8K questions and the demo's 512-token context.

With its tool schema, most first prompts of math-python do not leave room for 64 completion
tokens in 512 with the tiny model's tokenizer. The run must stop before any server starts, with
one message naming the context, the longest prompt and the fix (exit 2), instead of generating
rollouts "without model tokens" until the no-signal watchdog stops it. With a higher
`orchestrator.max_overlong_fraction` the same prompts are dropped with one line giving the count.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rlkit.config import load_config
from rlkit.launch.config import RLJobConfig
from rlkit.orchestrator.config import EnvSpec
from tests.helpers.cli import DEMO_CONFIG, RLKIT, ROOT

pytestmark = pytest.mark.slow

GSM8K = ROOT / "environments/math/math_env/data/gsm8k_test.jsonl"
ROWS = 200


def write_config(model: Path, tmp_path: Path) -> Path:
    """The CPU demo's config (its `--max-model-len 512`) on math-python with GSM8K questions."""
    data = tmp_path / "gsm8k.jsonl"
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:ROWS]]
    data.write_text(
        "".join(json.dumps({k: r[k] for k in ("question", "answer")}) + "\n" for r in rows)
    )
    cfg = load_config(RLJobConfig, DEMO_CONFIG, [f"--model.path={model}"])
    cfg.env = [EnvSpec(id="math-python", args={"dataset": str(data), "verify_workers": 1})]
    cfg.orchestrator.sampling = {"temperature": 1.0, "max_tokens": 64}
    cfg.log.run_dir = str(tmp_path / "run")
    config = tmp_path / "train.toml"
    config.write_text(cfg.to_toml())
    return config


def test_prompts_over_the_context_stop_the_run_before_it_starts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = write_config(tiny_model_dir, tmp_path)
    proc = subprocess.run(
        [RLKIT, "train", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = proc.stderr
    found = re.search(
        rf"(\d+) of {ROWS} prompts of math-python are longer than max_model_len 512 - "
        r"max_tokens 64 = 448 tokens \(longest prompt (\d+) tokens",
        message,
    )
    assert found, message
    assert int(found[1]) > ROWS // 2 and int(found[2]) > 448
    assert f"--max-model-len {int(found[2]) + 64} or more" in message
    assert "inference server" not in message and "consecutive groups" not in message
    assert not (tmp_path / "run").exists()


def test_a_higher_threshold_drops_them_with_the_count(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = write_config(tiny_model_dir, tmp_path)
    proc = subprocess.run(
        [RLKIT, "train", str(config), "--orchestrator.max_overlong_fraction=0.95", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dropped = re.findall(
        rf"^math-python: dropped (\d+) of {ROWS} training prompts longer than max_model_len 512",
        proc.stderr,
        flags=re.M,
    )
    assert len(dropped) == 1 and 0 < int(dropped[0]) < ROWS, proc.stderr


def test_a_missing_model_is_the_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    """Issue 45: it printed "prompt lengths not checked: no local tokenizer" first and left
    run/config.toml and run/token behind."""
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(
        [RLKIT, "train", str(DEMO_CONFIG), f"--model.path={missing}",
         f"--log.run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip() == f"error: model directory not found: {missing}"
    assert not (tmp_path / "run").exists()
