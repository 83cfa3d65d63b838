"""The `[log]` sinks write what their own readers read back: TensorBoard event files (read with
tensorboard's EventAccumulator), a W&B offline run directory and an MLflow store (an SQLite
file), each with the same metric names, and the sample-rollout table where the backend has one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlkit.orchestrator.config import LogConfig
from rlkit.orchestrator.loggers import mlflow_store, open_sinks, scalars
from tests.helpers.logger_files import tensorboard_scalars, wandb_history


def mlflow_run(run_dir: Path) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_store(run_dir.resolve()))
    experiment = client.get_experiment_by_name("rlkit")
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


@pytest.mark.slow  # wandb (its service process) and mlflow start up
def test_every_sink_gets_the_same_names_and_the_samples(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LogConfig(
        run_dir=str(tmp_path),
        tensorboard=True,
        wandb=True,
        wandb_mode="offline",
        mlflow=True,
    )
    records = [
        {"step": s, "reward_mean": 0.1 * s, "reward_mean/reverse-text": 0.2 * s, "recovered": True}
        for s in (1, 2)
    ]
    samples = [{"step": 2, "env_id": "e", "prompt": "abc", "completion": "cba", "reward": 1.0}]
    sinks = open_sinks(cfg, {"model": {"path": "m"}})
    for record in records:
        for sink in sinks:
            sink.log(scalars(record), record["step"])
    for sink in sinks:
        sink.log_samples(samples, 2)
        sink.close()
    names = {"reward_mean", "reward_mean/reverse-text"}  # `recovered` (a flag) is JSONL-only

    tb = tensorboard_scalars(tmp_path / "tensorboard")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    (text,) = events.Tensors("sample_rollouts/text_summary")
    assert text.step == 2 and b"| abc | cba | 1.0 |" in text.tensor_proto.string_val[0]
    assert set(tb) == names and [s for s, _ in tb["reward_mean"]] == [1, 2]
    history = wandb_history(tmp_path)
    assert [r["_step"] for r in history] == [1, 2]
    assert {k for r in history for k in r if not k.startswith(("_", "sample_rollouts/"))} == names
    assert history[1]["reward_mean"] == 0.2 and history[1]["sample_rollouts/_type"] == "table-file"
    assert history[1]["sample_rollouts/nrows"] == 1
    client, mlrun = mlflow_run(tmp_path)
    assert set(mlrun.data.metrics) == names
    history = client.get_metric_history(mlrun.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2)]
    table = client.download_artifacts(
        mlrun.info.run_id, "sample_rollouts/step_000002.json", str(tmp_path)
    )
    assert json.loads(Path(table).read_text())["data"] == [[2, "e", "abc", "cba", 1.0]]
