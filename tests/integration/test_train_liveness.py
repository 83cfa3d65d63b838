"""`rlkit train` end to end on the tiny model: a custom loss from the user's own module, and the
no-signal watchdog stopping runs that would otherwise generate and drop groups forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import tiny_train_cmd
from tests.helpers.train_runs import SHORT, run

pytestmark = pytest.mark.slow


def test_custom_loss_from_a_user_module_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        "--loss.name=my_losses:scaled_grpo",
        "--loss.params={scale = 0.25}",
        "--loss.old_policy=recomputed",
        "--trainer.mini_batches=2",
    )
    assert run(cmd, tmp_path / "run.log") == 0, (tmp_path / "run.log").read_text()[-3000:]
    # triton's teardown report (rlkit_cli.main.quiet_triton_teardown) stays out of the output
    assert "nanobind: leaked" not in (tmp_path / "run.log").read_text()
    records = [json.loads(x) for x in (run_dir / "trainer_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["custom_scale"] == pytest.approx(0.25) and r["mini_steps"] == 2 for r in records)
    # A bad parameter of the custom loss is a config error naming it; nothing is written.
    bad = tmp_path / "bad"
    cmd = tiny_train_cmd(tiny_model_dir, bad, "--loss.name=my_losses:scaled_grpo")
    assert run([*cmd, "--loss.params.scale=-1"], tmp_path / "bad.log") == 2
    assert "params.scale" in (tmp_path / "bad.log").read_text() and not bad.exists()


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("zero", ["no-signal: all rewards equal within each group (rewards 0 x64)"]),
        ("raise", ["no-signal: every rollout errored (", "no-signal reward function failed"]),
    ],
)
def test_no_signal_run_stops_with_a_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, mode: str, why: list[str]
) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        "--env.0.id=no-signal",
        f'--env.0.args={{mode = "{mode}"}}',
        "--orchestrator.watchdog.warn_groups=3",
        "--orchestrator.watchdog.stop_groups=8",
    )
    log = tmp_path / "run.log"
    code = run(cmd, log, timeout=600)
    text = " ".join(log.read_text().split())  # rich wraps long lines
    assert code == 1, text[-3000:]
    assert "8 consecutive groups without learning signal" in text
    assert all(part in text for part in why), text[-3000:]
    assert "3 consecutive groups without learning signal" in text  # the earlier warning
    assert (run_dir / "checkpoints" / "step_000000").is_dir()  # resumable: trainer + sampler
    assert (run_dir / "orchestrator" / "step_000000.json").exists()
    assert "checkpoint of step 0 written" in text
