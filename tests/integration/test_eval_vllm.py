"""`rlkit eval` against the real vLLM CPU server (shared session fixture) with a tiny model."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from rlkit_cli.main import main


def eval_cli(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["rlkit", "eval", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, out + err
    return out


def check_engine_results(output_dir: Path, n: int, r: int) -> list[dict]:
    """n*r results with the engine's token ids and one finite logprob <= 0 per token."""
    (run_dir,) = list(output_dir.iterdir())
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted((rec["example_index"], rec["rollout_index"]) for rec in lines) == [
        (i, j) for i in range(n) for j in range(r)
    ]
    for rec in lines:
        assert rec["error"] is None, rec["error"]
        (turn,) = rec["turns"]
        assert turn["prompt_token_ids"] and turn["completion_token_ids"]
        assert all(0 <= t < 1024 for t in turn["prompt_token_ids"] + turn["completion_token_ids"])
        assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"])
        assert all(math.isfinite(lp) and lp <= 0 for lp in turn["completion_logprobs"])
        assert 0.0 <= rec["reward"] <= 1.0
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "complete"
    return lines


@pytest.mark.slow
def test_reverse_text_and_math_on_vllm(vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys):
    base = ["-m", str(tiny_model_dir), "-b", f"{vllm_server.url}/v1", "-t", "16", "-T", "1.0"]
    out = eval_cli(
        monkeypatch, capsys, "reverse-text", *base, "-n", "3", "-r", "2", "-o", str(tmp_path / "rt")
    )
    assert "pass@2" in out
    check_engine_results(tmp_path / "rt", n=3, r=2)

    eval_cli(monkeypatch, capsys, "math", *base, "-n", "2", "-r", "2", "-o", str(tmp_path / "m"))
    lines = check_engine_results(tmp_path / "m", n=2, r=2)
    assert all("boxed_answer" in rec["metrics"] for rec in lines)
