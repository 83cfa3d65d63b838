"""What a user sees of a short real `rlkit train` (the CPU demo's config, 3 C3PO++ steps, fresh
tiny model) on two environments (reverse-text and a folder environment, `./flaky-env`, whose
reward function raises on half its rows), logged to TensorBoard, W&B (offline) and MLflow at
once, its console output captured to a file as in CI, then browsed with `rlkit runs show`
(terminal and HTML).

Checked: exactly one plain line per step in the captured output (no wrapping, no colour codes);
the same metric names in metrics.jsonl, the TensorBoard event files (tensorboard's reader), the
W&B offline run's history and the MLflow run (tags without path punctuation), with the eval
points and the sample rollouts (from both environments) in each; every errored rollout in
errors.jsonl and its cause counted in the step records; the summary's facts, errors grouped by
cause; the HTML report rendered by headless chromium (a curve and eval points per environment,
labelled, and a closing note per environment), with a screenshot kept under tmp.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rlkit.orchestrator.loggers import eval_scalars, mlflow_store, scalars
from rlkit.protocol.panels import PLOT_PANELS
from tests.helpers.browser import assert_rendered, headless_chromium
from tests.helpers.cli import run_cli, tiny_train_cmd
from tests.helpers.flaky_env import CAUSE, write_flaky_env
from tests.helpers.logger_files import tensorboard_scalars, wandb_history
from tests.helpers.session_server import on_session_server

pytestmark = pytest.mark.slow
STEPS = 3
STEP_LINE = re.compile(r"^step +(\d+) \| reward .* \| errored \d+$")
ENVS = (
    '--env=[{id = "reverse-text", args = { min_len = 3, max_len = 6, alphabet = "BCFGJKPQWX", '
    'num_train_examples = 2000, num_eval_examples = 128, system_prompt = "Reverse the text." }}, '
    '{id = "./flaky-env"}]'
)


@pytest.fixture(scope="module")
def run(
    vllm_server, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """(run_dir, captured stdout+stderr) of one short run with every logger on, on the session's
    server."""
    root = tmp_path_factory.mktemp("logged")
    run_dir = root / "run"
    log = root / "train.log"
    write_flaky_env(root / "flaky-env")
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *urls,
            ENVS,
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
            done = subprocess.run(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, timeout=900)
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
    assert "reward_mean/flaky-env" in names and not [n for n in names if "/./" in n]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    eval_names = set(eval_scalars({e["env_id"]: e for e in evals}))
    assert {
        "eval/reward_mean/reverse-text",
        "eval/errors/flaky-env",
        "eval/pass_at_1/flaky-env",
    } <= eval_names

    tb = tensorboard_scalars(run_dir / "tensorboard")
    assert set(tb) == names | eval_names and [s for s, _ in tb["batch_samples"]] == [1, 2, 3]
    assert [s for s, _ in tb["eval/reward_mean/flaky-env"]] == [0, STEPS]
    history = wandb_history(run_dir)
    assert [r["_step"] for r in history] == [0, 1, 2, 3]
    logged = {k for r in history for k in r if not k.startswith(("_", "sample_rollouts/"))}
    assert logged == names | eval_names
    assert all(
        r["sample_rollouts/_type"] == "table-file" and r["sample_rollouts/nrows"] == 2
        for r in history[1:]
    )
    client = MlflowClient(tracking_uri=mlflow_store(run_dir.resolve()))
    (mlrun,) = client.search_runs([client.get_experiment_by_name("rlkit").experiment_id])
    assert set(mlrun.data.metrics) == names | eval_names
    tables = [a.path for a in client.list_artifacts(mlrun.info.run_id, "sample_rollouts")]
    assert tables == [f"sample_rollouts/step_{s:06d}.json" for s in range(1, STEPS + 1)]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * STEPS and all(s["prompt"] and "reward" in s for s in samples)
    # drawn from every environment in a step's batch, the environments taking turns
    assert {s["env_id"] for s in samples} == {"reverse-text", "./flaky-env"}


def test_errored_rollouts_are_kept_with_their_cause(run: tuple[Path, str]) -> None:
    run_dir, _ = run
    errors = [json.loads(line) for line in (run_dir / "errors.jsonl").read_text().splitlines()]
    train = [e for e in errors if e["phase"] == "train"]
    assert train and {e["env_id"] for e in train} == {"./flaky-env"}
    assert all(e["cause"] == CAUSE and e["error"].endswith("x" * 300 + " END") for e in train)
    assert all(int(e["example_id"]) % 2 == 1 for e in train)  # the odd rows raise
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    key = "rollouts_errored/reward_function_picky_raised_valueerror"
    assert sum(r.get(key, 0) for r in records) == len(train)
    assert sum(r["rollouts_errored"] for r in records) == len(train)
    evaluated = [e for e in errors if e["phase"] == "eval"]
    assert len(evaluated) == 2 * 4  # the eval's two odd rows of four, 2 rollouts, twice


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
    assert re.search(rf"errored training rollouts \d+ of \d+: {re.escape(CAUSE)}", output), output
    assert f"errored eval rollouts 8 of 32: {CAUSE}" in output
    assert re.search(r"reward \./flaky-env: [\d.]+ -> [\d.]+", output), output
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
        assert page.locator("#evals tr").count() == 3  # header + each environment
        assert page.locator("#samples tr").count() == 1 + 2 * STEPS
        reward_plot = page.locator("#plots svg").first
        assert reward_plot.locator("polyline").count() == 3  # the mean and each environment
        for env in ("reverse-text", "./flaky-env"):
            assert reward_plot.locator(f'g.eval[data-env="{env}"]').count() == 2
            assert f"eval {env} (95% interval)" in (reward_plot.text_content() or "")
            assert f"training reward {env}" in (reward_plot.text_content() or "")
        note = page.inner_text("#note")
        assert note.startswith("Per environment: reverse-text: training reward"), note
        assert "./flaky-env:" in note and "2 eval points" in note
        page.screenshot(path=str(shot), full_page=False)
    assert_rendered(shot, (1280, 1000))
    print(f"runs show screenshot: {shot}")
