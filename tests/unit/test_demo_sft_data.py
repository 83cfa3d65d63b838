"""The CPU demo's SFT warm-start data shares no string with the environment's train or eval rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples/tiny-cpu/make_sft_data.py"


@pytest.mark.slow  # the demo's data script in a subprocess (~7 s)
def test_sft_data_is_disjoint_from_train_and_eval_rows(tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, timeout=300)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from make_sft_data import env_args, environment_texts
    finally:
        sys.path.remove(str(SCRIPT.parent))
    args = env_args(SCRIPT.parent / "train.toml")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    sft = [row["prompt"][1]["content"] for row in rows]
    env_texts = environment_texts(args)
    assert len(rows) == 4000 and len(env_texts) > 1000  # train + eval strings (some repeat)
    assert not set(sft) & env_texts
    assert all(row["prompt"][0]["content"] == args["system_prompt"] for row in rows)
    assert all(r["completion"][0]["content"] == r["prompt"][1]["content"][::-1] for r in rows)
