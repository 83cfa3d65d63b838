"""Checks on an `rlkit eval` output folder written against a real engine."""

from __future__ import annotations

import json
import math
from pathlib import Path


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
