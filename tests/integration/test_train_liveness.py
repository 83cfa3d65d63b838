"""`rlkit train` end to end on the tiny model: a custom loss from the user's own module, the
no-signal watchdog stopping runs that would otherwise generate and drop groups forever, and a run
whose every server is gone past `inference.recover_timeout_s` stopping resumably."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import tiny_train_cmd
from tests.helpers.planted import Planted
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import SHORT, run, run_killing_the_server

pytestmark = pytest.mark.slow


def test_custom_loss_from_a_user_module_trains(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            *urls,
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
        ("zero", ["no-signal: all rewards equal within each group (rewards 0 x128)"]),
        ("raise", ["no-signal: every rollout errored (", "no-signal reward function failed"]),
    ],
)
def test_no_signal_run_stops_with_a_checkpoint(
    vllm_server, tiny_model_dir: Path, tmp_path: Path, mode: str, why: list[str]
) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "run.log"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            *urls,
            "--env.0.id=no-signal",
            f'--env.0.args={{mode = "{mode}"}}',
            "--orchestrator.watchdog.warn_groups=3",
            "--orchestrator.watchdog.stop_groups=8",
        )
        code = run(cmd, log, timeout=600)
    text = " ".join(log.read_text().split())  # rich wraps long lines
    assert code == 1, text[-3000:]
    assert "8 consecutive groups without learning signal" in text
    assert all(part in text for part in why), text[-3000:]
    assert "3 consecutive groups without learning signal" in text  # the earlier warning
    assert (run_dir / "checkpoints" / "step_000000").is_dir()  # resumable: trainer + sampler
    assert (run_dir / "orchestrator" / "step_000000.json").exists()
    assert "checkpoint of step 0 written" in text


def test_all_servers_lost_stops_with_a_checkpoint_and_resumes(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The only server SIGKILLed and not relaunched: after `recover_timeout_s` the run stops with
    a one-line error, exit code 1 and a checkpoint. A pickle planted in that checkpoint is refused
    by the resumed trainer, not run, and the run stops at once rather than after
    `recover_timeout_s`; without it, `--resume` on another server (the session's: an engine start
    less) finishes the run."""
    run_dir = tmp_path / "run"
    steps = 6
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={steps}",
        "--inference.restart_dead_servers=false",
        "--inference.recover_timeout_s=5",
        "--inference.health_interval_s=1",
    )
    log = tmp_path / "run.log"
    code = run_killing_the_server(cmd, log, run_dir, after_step=2)
    text = " ".join(log.read_text().split())  # rich wraps long lines
    assert code == 1, text[-3000:]
    assert "stopping: no inference server healthy for 5s" in text
    assert "Traceback" not in text
    stopped = int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[1])
    assert "written; continue with --resume" in text  # the trainer confirmed its checkpoint
    assert 2 <= stopped < steps

    extra = run_dir / "checkpoints" / f"step_{stopped:06d}" / "extra_rank0.pt"
    saved = extra.read_bytes()
    marker = tmp_path / "planted-pickle-ran"
    torch.save({"step": stopped, "rng": Planted(str(marker))}, extra)

    resumed = tmp_path / "resumed.log"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        # the trainer publishes step `stopped` again, signed with the session server's
        # credential (the run's own signed it first): the server is back once it has
        again = [*cmd, "--resume", *urls, "--inference.recover_timeout_s=300"]
        started = time.monotonic()
        code = run(again, tmp_path / "planted.log", timeout=600)
        planted = " ".join((tmp_path / "planted.log").read_text().split())
        assert code == 1, planted[-3000:]
        assert (
            "error: the trainer exited with code 2 while the run started: "
            f"checkpoint file {extra} holds more than tensors"
        ) in planted, planted[-3000:]
        assert "Traceback" not in planted
        assert not marker.exists()
        assert time.monotonic() - started < 300  # not after recover_timeout_s

        extra.write_bytes(saved)
        code = run(again, resumed, timeout=600)
    assert code == 0, resumed.read_text()[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records][-1] == steps
