"""`rlkit runs show` on a run directory written by hand (the real run is in
tests/integration/test_train_logging.py): sparkline, the facts, and usage errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlkit.protocol.panels import PLOT_PANELS
from rlkit.runs.show import _svg, load_run, render_html, sparkline, summary_lines
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
    assert (
        "rollouts 0 finished, 2 errored (scored 0), 0 purged (dropped unused: too far "
        "off-policy to train on)"
    ) in lines
    assert "stopped: 3 consecutive groups without learning signal" in lines
    assert f"checkpoints {tmp_path / 'checkpoints' / 'step_000002'}" in lines
    page = render_html(load_run(tmp_path))
    assert (
        page.count("<svg") == len(PLOT_PANELS)
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


def test_the_html_report_answers_did_training_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Issue 45: loss, gradient norm, entropy and learning rate panels, evaluations with 95%
    intervals on the reward plot, resumed steps marked, every axis labelled at three ticks, the
    legend below the axes, and the summary's counts explained."""
    run = tmp_path / "run"
    run.mkdir()
    steps = [
        {"step": s, "reward_mean": 0.1 * s, "loss": 1.0 / s, "grad_norm": 2.0, "entropy": 1.5,
         "lr": 1e-5, "tokens_per_s": 100.0, "rollouts_finished": 8, "rollouts_purged": 1,
         "completion_len_mean": 10.0 + s, "completion_len_max": 20 + s,
         "reward_fn_mean/e/correct": 0.5, "rollout_time_s": 0.0, "train_time_s": 2.0,
         "step_time_s": 2.0}
        for s in range(1, 7)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    evals = [
        {"step": 0, "env_id": "e", "reward_mean": 0.2, "reward_std": 0.4, "num_examples": 16},
        {"step": 6, "env_id": "e", "reward_mean": 0.5, "reward_std": 0.5, "num_examples": 16},
    ]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (run / "resumes.jsonl").write_text('{"step": 3}\n')
    (run / "config.toml").write_text('[orchestrator]\nmax_steps = 6\n[[env]]\nid = "e"\n')
    out_html = tmp_path / "report.html"
    code, out = run_cli(monkeypatch, capsys, "runs", "show", str(run), "--html", str(out_html))
    assert code in (None, 0), out
    assert "eval e: reward 0.200 ± 0.196 (step 0) -> 0.500 ± 0.245 (step 6); ± is a 95% " in out
    assert "6 purged (dropped unused: too far off-policy to train on)" in out
    assert "completion length mean 13.5, max 26 tokens" in out
    assert "reward functions (mean over the run): e/correct 0.500" in out
    assert "waited 0.0s for the batch's rollouts (0 when they were generated while" in out
    page = out_html.read_text()
    titles = ("loss", "gradient norm", "entropy (nats per token)", "learning rate")
    for title in (*titles, "completion length (tokens)"):
        assert f'class="title">{title}</text>' in page
    assert page.count('<line x1="') >= 2 and 'class="eval"' in page  # error bars
    assert "eval e (95% interval)" in page
    assert "resumed from step 3" in page and page.count('class="resume"') >= 5
    assert ">step</text>" in page and 'text-anchor="middle">3</text>' in page  # mid tick


def write_rising_run(run: Path, exact_after: float) -> None:
    """A run whose training reward rises 0.2 -> 0.7 and whose eval reports exact match."""
    run.mkdir()
    steps = [{"step": s, "reward_mean": 0.2 + 0.05 * s} for s in range(11)]
    steps[-1]["exploit_flagged/e/echo"] = 3
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    evals = [
        {
            "step": 0,
            "env_id": "e",
            "reward_mean": 0.4,
            "num_examples": 64,
            "num_rollouts": 256,
            "metrics": {"exact_match": 0.01},
        },
        {
            "step": 10,
            "env_id": "e",
            "reward_mean": 0.6,
            "num_examples": 64,
            "num_rollouts": 256,
            "metrics": {"exact_match": exact_after},
        },
    ]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))


def test_runs_show_warns_when_reward_rises_without_the_strict_measure(tmp_path: Path) -> None:
    """Issue 61: a training reward that rises while held-out exact match does not is flagged,
    with the exploit detectors' counts; a real gain in exact match is not."""
    write_rising_run(tmp_path / "gamed", exact_after=0.02)
    lines = summary_lines(load_run(tmp_path / "gamed"))
    assert "eval e: exact match 0.010 ± 0.012 -> 0.020 ± 0.017" in lines
    warning = next(line for line in lines if line.startswith("WARNING e:"))
    assert "did not (0.010 -> 0.020" in warning and "rlkit env audit e" in warning
    assert any("e/echo 3" in line for line in lines)

    write_rising_run(tmp_path / "learned", exact_after=0.3)
    lines = summary_lines(load_run(tmp_path / "learned"))
    assert not any(line.startswith("WARNING e:") for line in lines)
    assert "eval e: exact match 0.010 ± 0.012 -> 0.300 ± 0.056" in lines
    page = render_html(load_run(tmp_path / "learned"))
    assert "<td>exact match 0.300 ± 0.056</td>" in page


def test_a_constant_is_drawn_on_an_axis_of_its_own_scale(tmp_path: Path) -> None:
    """A constant learning rate of 1e-6 gets ticks around 1e-6, not -0.5 .. 0.5; the summary
    names the latest weights once."""
    (tmp_path / "config.toml").write_text('[model]\npath = "m"\n')
    steps = [{"step": s, "lr": 1e-6} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    for step in (2, 3):
        (tmp_path / "weights" / f"step_00000{step}").mkdir(parents=True)
    run = load_run(tmp_path)
    panel = _svg(run, "learning rate", ("lr",))
    ticks = re.findall(r'x="62" y="[^"]+" text-anchor="end">([^<]+)</text>', panel)
    assert ticks == ["9e-07", "1e-06", "1.1e-06"], ticks
    lines = summary_lines(run)
    assert [line for line in lines if "weights" in line] == [
        f"latest weights {tmp_path / 'weights' / 'step_000003'}"
    ]


def test_two_environments_and_their_errors_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Issue 66: errored rollouts grouped by cause per phase (full text on --errors, one line
    each); the HTML report has a training curve per environment, eval points labelled with
    the environment's colour, and a closing note of what it shows per environment."""
    from rlkit.runs.rollout_errors import append_errors, error_record

    run = tmp_path / "run"
    run.mkdir()
    steps = [
        {"step": s, "reward_mean": 0.1 * s, "reward_mean/a": 0.2 * s, "reward_mean/./b": 0.05,
         "rollouts_finished": 8}
        for s in range(1, 4)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    evals = [
        {"step": s, "env_id": env, "reward_mean": m, "reward_std": 0.3, "num_examples": 4,
         "num_rollouts": 8}
        for s in (0, 3) for env, m in (("a", 0.4), ("./b", 0.1))
    ]  # fmt: skip
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (run / "config.toml").write_text('[[env]]\nid = "a"\n[[env]]\nid = "./b"\n')
    long = "ValueError: " + "y" * 200
    append_errors(
        run,
        [error_record(env_id="./b", example_id=i, error=f"reward function 'f' failed: {long}",
                      phase="train", step=1) for i in range(3)]
        + [error_record(env_id="./b", example_id=0, error="generation failed: HTTP 500 x",
                        phase="eval", step=3)],
    )  # fmt: skip
    out_html = tmp_path / "report.html"
    code, out = run_cli(
        monkeypatch, capsys, "runs", "show", str(run), "--html", str(out_html), "--errors"
    )
    assert code in (None, 0), out
    assert "errored training rollouts 3 of 24: reward function 'f' raised ValueError" in out
    assert "errored eval rollouts 1 of 32: generation failed (HTTP 500)" in out
    assert "reward a: 0.200 -> 0.600" in out and "reward ./b: 0.050 -> 0.050" in out
    assert out.count("y" * 200) == 3  # --errors: every message in full, one line each
    page = out_html.read_text()
    assert "training reward a" in page and "training reward ./b" in page
    assert "eval a (95% interval)" in page and "eval ./b (95% interval)" in page
    assert page.count('<g class="eval" data-env="./b">') == 2
    assert 'id="note">Per environment: a: training reward 0.200 -&gt; 0.600' in page
