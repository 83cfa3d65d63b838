"""`rlkit runs show` on a run directory written by hand (the real run is in
tests/integration/test_train_logging.py): sparkline, the facts, and usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.runs.show import load_run, render_html, sparkline, summary_lines
from tests.helpers.cli import run_cli


def test_sparkline_spans_the_blocks_and_buckets_long_series() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([]) == ""
    assert len(sparkline([float(i) for i in range(500)], width=40)) == 40


def test_summary_of_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[model]\npath = "m"\n[[env]]\nid = "e"\n[orchestrator]\nmax_steps = 4\n'
    )
    steps = [
        {"step": s, "reward_mean": 0.25 * s, "tokens_per_s": 100.0, "rollouts_errored": s % 2}
        for s in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    evals = [
        {"step": 0, "env_id": "e", "reward_mean": 0.1},
        {"step": 3, "env_id": "e", "reward_mean": 0.6},
    ]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "STOP").write_text("3 consecutive groups without learning signal")
    lines = summary_lines(load_run(tmp_path))
    assert lines[1:3] == ["model m on e", "steps 3 of 4"]
    assert "reward 0.250 -> 0.750 (min 0.250, max 0.750)  ▁▄█" in lines
    assert "eval e: reward 0.100 (step 0) -> 0.600 (step 3)" in lines
    assert any(line.startswith("throughput 100 completion tok/s") for line in lines)
    assert "rollouts 0 finished, 2 errored, 0 purged" in lines
    assert "stopped: 3 consecutive groups without learning signal" in lines
    assert f"checkpoints {tmp_path / 'checkpoints' / 'step_000002'}" in lines
    page = render_html(load_run(tmp_path))
    assert (
        page.count("<svg") == 6
        and "<script" not in page
        and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )


def test_a_directory_that_is_not_a_run_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, output = run_cli(monkeypatch, capsys, "runs", "show", str(tmp_path))
    assert code == 2 and "is not a training run directory" in output
    code, output = run_cli(monkeypatch, capsys, "runs", "show", str(tmp_path / "nope"))
    assert code == 2 and "no such run directory" in output
