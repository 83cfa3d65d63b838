"""What a user sees of a short real `rlkit train` (the CPU demo's config, 3 C3PO++ steps, fresh
tiny model), logged to TensorBoard, W&B (offline) and MLflow at once, its console output
captured to a file as in CI, then browsed with `rlkit runs show` (terminal and HTML).

Checked: exactly one plain line per step in the captured output (no wrapping, no colour codes);
the same metric names in metrics.jsonl, the TensorBoard event files (tensorboard's reader), the
W&B offline run's history and the MLflow run, with the sample rollouts in each; the summary's
facts; the HTML report rendered by headless chromium, with a screenshot kept under tmp.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rlkit.orchestrator.loggers import mlflow_store, scalars
from rlkit.protocol.panels import PLOT_PANELS
from tests.helpers.browser import assert_rendered, headless_chromium
from tests.helpers.cli import run_cli, tiny_train_cmd
from tests.helpers.logger_files import tensorboard_scalars, wandb_history
from tests.helpers.session_server import on_session_server

pytestmark = pytest.mark.slow
STEPS = 3
STEP_LINE = re.compile(r"^step +(\d+) \| reward .* \| errored \d+$")


@pytest.fixture(scope="module")
def run(
    vllm_server, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """(run_dir, captured stdout+stderr) of one short run with every logger on, on the session's
    server."""
    root = tmp_path_factory.mktemp("logged")
    run_dir = root / "run"
    log = root / "train.log"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *urls,
            f"--orchestrator.max_steps={STEPS}",
            "--orchestrator.schedulers.c3po.capacity=16",
            "--orchestrator.schedulers.c3po.token_budget=128",
            "--orchestrator.drop_zero_advantage=false",  # an untrained model solves nothing
            "--orchestrator.eval.examples=4",
            "--orchestrator.eval.rollouts_per_example=2",
            "--ckpt.interval=2",
            "--log.plot=false",
            "--log.tensorboard=true",
            "--log.wandb=true",
            "--log.wandb_mode=offline",
            "--log.mlflow=true",
            "--log.samples_every=1",
            "--log.samples_per_step=2",
        )
        with open(log, "w") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    return run_dir, text


def test_captured_output_has_one_plain_line_per_step(run: tuple[Path, str]) -> None:
    _, text = run
    assert "\x1b[" not in text
    steps = [int(m[1]) for line in text.splitlines() if (m := STEP_LINE.match(line))]
    assert steps == list(range(1, STEPS + 1)), text[-3000:]
    assert len([line for line in text.splitlines() if line.startswith("step ")]) == STEPS


def test_every_logger_has_the_same_metric_names(run: tuple[Path, str]) -> None:
    from mlflow.tracking import MlflowClient

    run_dir, _ = run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    names = {key for record in records for key in scalars(record)}
    assert {"reward_mean", "mismatch_kl", "tokens_per_s", "reward_mean/reverse-text"} <= names

    tb = tensorboard_scalars(run_dir / "tensorboard")
    assert set(tb) == names and [s for s, _ in tb["batch_samples"]] == [1, 2, 3]
    history = wandb_history(run_dir)
    assert [r["_step"] for r in history] == [1, 2, 3]
    assert {k for r in history for k in r if not k.startswith(("_", "sample_rollouts/"))} == names
    assert all(
        r["sample_rollouts/_type"] == "table-file" and r["sample_rollouts/nrows"] == 2
        for r in history
    )
    client = MlflowClient(tracking_uri=mlflow_store(run_dir.resolve()))
    (mlrun,) = client.search_runs([client.get_experiment_by_name("rlkit").experiment_id])
    assert set(mlrun.data.metrics) == names
    tables = [a.path for a in client.list_artifacts(mlrun.info.run_id, "sample_rollouts")]
    assert tables == [f"sample_rollouts/step_{s:06d}.json" for s in range(1, STEPS + 1)]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * STEPS and all(s["prompt"] and "reward" in s for s in samples)


def test_runs_show_summarises_the_run(
    run: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir, _ = run
    code, output = run_cli(monkeypatch, capsys, "runs", "show", str(run_dir))
    assert code in (0, None), output
    assert f"steps {STEPS} of {STEPS}" in output
    assert re.search(r"reward [-\d.]+ -> [-\d.]+ .*[▁▂▃▄▅▆▇█]{2}", output), output
    assert re.search(
        r"eval reverse-text: reward [\d.]+ ± [\d.]+ \(step 0\) -> [\d.]+ ± [\d.]+ \(step 3\)",
        output,
    ), output
    assert "completion tok/s" in output and "mismatch KL mean" in output
    assert f"checkpoints {run_dir / 'checkpoints' / 'step_000002'}" in output


@pytest.mark.system
def test_runs_show_html_renders_in_headless_chromium(
    run: tuple[Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    run_dir, _ = run
    report = tmp_path / "report.html"
    code, output = run_cli(monkeypatch, capsys, "runs", "show", str(run_dir), "--html", str(report))
    assert code in (0, None) and f"report: {report}" in output
    shot = tmp_path / "runs-show.png"
    with headless_chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(report.as_uri())
        assert f"steps {STEPS} of {STEPS}" in page.inner_text("#summary")
        assert page.locator("#plots svg").count() == len(PLOT_PANELS)
        assert (
            page.locator("#plots svg polyline").count() >= len(PLOT_PANELS) - 1
        )  # curves with data
        assert page.locator("#evals tr").count() == 2  # header + reverse-text
        assert page.locator("#samples tr").count() == 1 + 2 * STEPS
        page.screenshot(path=str(shot), full_page=False)
    assert_rendered(shot, (1280, 1000))
    print(f"runs show screenshot: {shot}")
