"""`rlkit eval logic` against the real vLLM CPU server with the tiny model (session fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from logic_env.tasks import LEVEL_NAMES, TASKS

from tests.helpers.cli import only_run_dir, run_cli


@pytest.mark.slow
def test_eval_every_task_and_level_on_vllm(
    vllm_server, tiny_model_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    combos = len(TASKS) * len(LEVEL_NAMES)  # the first rows cover every task at every level
    code, out = run_cli(
        monkeypatch, capsys, "eval", "logic", "-m", str(tiny_model_dir),
        "-b", f"{vllm_server.url}/v1", "-n", str(combos), "-r", "1", "-t", "24", "-T", "1.0",
        "-o", str(tmp_path), "--token-file", str(vllm_server.token_file),
    )  # fmt: skip
    assert code == 0, out
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "metadata.json").read_text())["summary"]
    assert summary["errors"] == 0 and summary["num_rollouts"] == combos, summary["error_examples"]
    assert set(summary["reward_by"]["task"]) == set(TASKS)
    assert set(summary["reward_by"]["level"]) == set(LEVEL_NAMES)
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        (turn,) = record["turns"]
        assert turn["completion_token_ids"] and len(turn["completion_logprobs"]) == len(
            turn["completion_token_ids"]
        )
        assert 0.0 <= record["reward"] <= 1.0 and "answer_format" in record["metrics"]
