"""Metric sinks behind `[log]`: TensorBoard, W&B and MLflow beside the JSONL that is always kept.

`run_dir/metrics.jsonl` (written by `MetricsLogger`) holds every step record as it is. Each sink
switched on receives the record's numbers under the same names (`reward_mean`, `mismatch_kl`,
`reward_mean/<env>`, ...; an environment named by its folder loses its path punctuation:
`tag_name`), so a curve is found under one name in every tool; the interleaved evals go to
each sink as `eval/<name>/<env>` points (`eval_scalars`); sample rollouts
(prompt, completion, reward) go every `log.samples_every` steps to `run_dir/samples.jsonl` and,
as a table, to each sink that has one (TensorBoard gets them as a markdown text).
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path
from typing import Any, Protocol

from rlkit.errors import UsageError
from rlkit.orchestrator.config import LogConfig

SAMPLE_COLUMNS = ("step", "env_id", "prompt", "completion", "reward")
SAMPLES = "sample_rollouts"  # the tables' name; `samples` is a trainer metric (batch size)


class Sink(Protocol):
    """One logging backend."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def tag_name(key: str) -> str:
    """A metric name as the sinks get it: an environment named by its folder (`./calc-tool`)
    keeps no path punctuation (`reward_mean/./calc-tool` -> `reward_mean/calc-tool`), and only
    characters MLflow accepts (`pass@1` -> `pass_at_1`)."""
    parts = [part for part in key.split("/") if part not in ("", ".", "..", "~")]
    return re.sub(r"[^\w\-. :/]", "_", "/".join(parts).replace("@", "_at_"))


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers (what every sink plots); flags, strings and missing values stay in
    the JSONL only."""
    return {
        tag_name(key): float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


def eval_scalars(summaries: dict[str, dict[str, Any]]) -> dict[str, float]:
    """An interleaved eval's numbers per environment, `eval/<name>/<env>` (reward mean and
    std, avg@k, pass@k, errors, each reward function's mean): the sinks' eval points."""
    record: dict[str, Any] = {}
    for env_id, summary in summaries.items():
        k = summary.get("rollouts_per_example")
        for name in ("reward_mean", "reward_std", f"avg@{k}", "errors"):
            record[f"eval/{name}/{env_id}"] = summary.get(name)
        for name, value in {**summary.get("pass_at_k", {}), **summary.get("metrics", {})}.items():
            record[f"eval/{name}/{env_id}"] = value
    return scalars(record)


def _text(messages: list[dict[str, Any]]) -> str:
    """A conversation as text: the content alone for one message, `role: content` lines else."""
    if len(messages) == 1:
        return str(messages[0].get("content") or "")
    return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages)


def sample_rows(groups: list[Any], n: int, step: int) -> list[dict[str, Any]]:
    """Up to `n` rollouts of a step's groups (the first of each group first, the environments
    taking turns), as table rows."""
    by_env: dict[str, list[Any]] = {}
    for group in groups:
        by_env.setdefault(group.env_id, []).append(group)
    queues = list(by_env.values())
    groups = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    picked = []
    depth = 0
    while len(picked) < n and any(depth < len(g.rollouts) for g in groups):
        picked += [(g.env_id, g.rollouts[depth]) for g in groups if depth < len(g.rollouts)]
        depth += 1
    return [
        {
            "step": step,
            "env_id": env_id,
            "prompt": _text(rollout.prompt[-1:]),
            "completion": _text(rollout.completion),
            "reward": rollout.reward,
        }
        for env_id, rollout in picked[:n]
    ]


class TensorBoardSink:
    """Event files in `run_dir/tensorboard` through torch's SummaryWriter."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", "<br>")

        header = "| " + " | ".join(SAMPLE_COLUMNS[1:]) + " |"
        rule = "|" + "---|" * (len(SAMPLE_COLUMNS) - 1)
        body = ["| " + " | ".join(cell(r[c]) for c in SAMPLE_COLUMNS[1:]) + " |" for r in rows]
        self.writer.add_text(SAMPLES, "\n".join([header, rule, *body]), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run in `run_dir/wandb` (offline mode writes nothing else, for `wandb sync`)."""

    def __init__(self, cfg: LogConfig, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.wandb_project,
            dir=cfg.run_dir,
            config=config,
            mode=cfg.wandb_mode,
            resume="allow",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        table = self.wandb.Table(
            columns=list(SAMPLE_COLUMNS), data=[[r[c] for c in SAMPLE_COLUMNS] for r in rows]
        )
        self.run.log({SAMPLES: table}, step=step)

    def close(self) -> None:
        self.run.finish()


def mlflow_store(run_dir: Path) -> str:
    """The default tracking store: an SQLite file in the run directory (no server). MLflow's
    `./mlruns` file store cannot hold our names: it keeps `reward_mean` as a file and
    `reward_mean/<env>` as a file inside a directory of the same name."""
    return f"sqlite:///{run_dir / 'mlflow.db'}"


class MlflowSink:
    """An MLflow run (tracking URI from `log.mlflow_tracking_uri`, else `mlflow_store`); the
    resolved config is stored as the run's `config.json` artifact."""

    def __init__(self, cfg: LogConfig, config: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        root = Path(cfg.run_dir).resolve()
        self.client = MlflowClient(tracking_uri=cfg.mlflow_tracking_uri or mlflow_store(root))
        experiment = self.client.get_experiment_by_name(cfg.mlflow_experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(
                cfg.mlflow_experiment, artifact_location=(root / "mlartifacts").as_uri()
            )
        )
        self.run_id = self.client.create_run(
            experiment_id, run_name=Path(cfg.run_dir).name
        ).info.run_id
        self.client.log_dict(self.run_id, config, "config.json")

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per log_batch call
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        columns = {c: [r[c] for r in rows] for c in SAMPLE_COLUMNS}
        self.client.log_table(self.run_id, columns, f"{SAMPLES}/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


SINK_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def check_sinks(cfg: LogConfig) -> None:
    """Refuse a run (before anything starts) whose `[log]` names a backend not installed."""
    for name, module in SINK_PACKAGES.items():
        if getattr(cfg, name) and importlib.util.find_spec(module) is None:
            raise UsageError(
                f"log.{name} = true needs the {module} package: "
                "pip install 'rlkit[loggers]', or set it to false"
            )


def open_sinks(cfg: LogConfig, config: dict[str, Any]) -> list[Sink]:
    """The sinks `[log]` switches on (`check_sinks` has checked their packages)."""
    sinks: list[Sink] = []
    if cfg.tensorboard:
        sinks.append(TensorBoardSink(Path(cfg.run_dir) / "tensorboard"))
    if cfg.wandb:
        sinks.append(WandbSink(cfg, config))
    if cfg.mlflow:
        sinks.append(MlflowSink(cfg, config))
    return sinks


def append_samples(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
