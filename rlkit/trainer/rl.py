"""The RL trainer loop: wait for the orchestrator's batch, one policy-loss step, publish weights.

Protocol with the orchestrator (files under `run_dir`): batches are numbered from 1; for step
N the trainer waits for `batches/step_{N:06d}.pt`, trains on it and publishes
`weights/step_{N:06d}/` (STABLE marker last), which becomes policy version N on the servers.
Metrics go to `trainer_metrics.jsonl`, one JSON object per step.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from torch import Tensor

from rlkit.errors import UsageError
from rlkit.trainer import dist
from rlkit.trainer.batch import TrainBatch, batch_path, read_batch
from rlkit.trainer.config import LossConfig, TrainerConfig
from rlkit.trainer.engine import LossFn, Trainer
from rlkit.trainer.export import prune_weights, weights_dir
from rlkit.trainer.loss import LOSS_PARAMS, policy_loss
from rlkit.trainer.metrics_log import MetricsLog
from rlkit.trainer.packing import MicroBatch, Sequence

console = Console(stderr=True)


def loss_aggregation(cfg: LossConfig) -> str:
    """Validate `[loss]` up front (not at the first batch) and return its aggregation."""
    if cfg.name not in LOSS_PARAMS:
        raise UsageError(f"loss.name {cfg.name!r} unknown; choose one of {sorted(LOSS_PARAMS)}")
    one = torch.zeros(1, 2)
    try:
        policy_loss(cfg.name, one, one, one, torch.zeros(1), torch.ones(1, 2), **cfg.params)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"loss.params: {exc}") from exc
    return cfg.params.get("agg", LOSS_PARAMS[cfg.name].get("agg", "token-mean"))


def batch_normalizer(seqs: list[Sequence], agg: str) -> float:
    """Global count the loss divides by: counted tokens, or sequences with any counted token."""
    if agg == "token-mean":
        count = sum(sum(s.loss_mask[1:]) for s in seqs)
    else:
        count = sum(1 for s in seqs if any(s.loss_mask[1:]))
    return float(max(count, 1))


def make_rl_loss(cfg: LossConfig) -> LossFn:
    """policy_loss(cfg.name, ...) on one micro-batch, dividing by the global normaliser."""

    def loss_fn(
        mb: MicroBatch, logprobs: Tensor, old: Tensor | None, entropy: Tensor, normalizer: float
    ) -> tuple[Tensor, dict]:
        d = logprobs.device
        return policy_loss(
            cfg.name,
            logprobs,
            old if old is not None else logprobs.detach(),
            mb.inference_logprobs.to(d),
            mb.advantages.to(d),
            mb.loss_mask.to(d),
            **{**cfg.params, "normalizer": normalizer, "entropy": entropy},
        )

    return loss_fn


def to_sequences(batch: TrainBatch) -> list[Sequence]:
    return [
        Sequence(s.token_ids, s.loss_mask, s.inference_logprobs, s.advantage) for s in batch.samples
    ]


def wait_for_batch(run_dir: str | Path, step: int, timeout_s: float) -> TrainBatch:
    """Block until the orchestrator's batch for `step` exists, then read and validate it."""
    path = batch_path(run_dir, step)
    start = time.monotonic()
    if not path.exists():
        with console.status(f"waiting for {path}") as status:
            while not path.exists():
                waited = time.monotonic() - start
                if waited > timeout_s:
                    raise TimeoutError(
                        f"no batch {path} after {timeout_s:.0f}s (is the orchestrator running? "
                        "raise batch_timeout_s to wait longer)"
                    )
                status.update(f"waiting for {path} ({waited:.0f}s)")
                time.sleep(0.2)
    return read_batch(path)


def batch_stats(batch: TrainBatch, step: int) -> dict[str, float]:
    versions = [s.policy_version for s in batch.samples]
    return {
        "samples": float(len(batch.samples)),
        "reward_mean": sum(s.reward for s in batch.samples) / len(batch.samples),
        "staleness_mean": sum(step - 1 - v for v in versions) / len(versions),
        "staleness_max": float(max(step - 1 - v for v in versions)),
    }


def run_rl(cfg: TrainerConfig) -> None:
    """Train until `max_steps` (or forever), one orchestrator batch per step."""
    if cfg.optim.schedule == "cosine" and not cfg.max_steps:
        raise UsageError("optim.schedule = 'cosine' needs max_steps > 0 to know the horizon")
    agg = loss_aggregation(cfg.loss)
    run_dir = Path(cfg.run_dir)
    loss_fn = make_rl_loss(cfg.loss)
    trainer = Trainer(cfg, total_steps=cfg.max_steps)
    try:
        step, _ = trainer.maybe_resume()
        if step and dist.is_main():
            console.print(f"resumed from step {step}")
        metrics = MetricsLog(run_dir / "trainer_metrics.jsonl", step, enabled=dist.is_main())
        while not cfg.max_steps or step < cfg.max_steps:
            step += 1
            batch = wait_for_batch(run_dir, step, cfg.batch_timeout_s)
            seqs = to_sequences(batch)
            result = trainer.train_step(
                seqs, loss_fn, batch_normalizer(seqs, agg), cfg.loss.recompute_old_logprobs
            )
            record = {"step": step, **batch_stats(batch, step), **result.metrics}
            if cfg.weights.publish:
                trainer.export(weights_dir(run_dir, step), extra={"step": step})
                if dist.is_main():
                    prune_weights(run_dir, cfg.weights.keep_last)
            if cfg.ckpt.interval and step % cfg.ckpt.interval == 0:
                trainer.save_checkpoint(step, {"next_batch": step + 1})
            if dist.is_main():
                metrics.append(record)
                note = " [red]skipped (non-finite loss or grad)[/]" if result.skipped else ""
                console.print(
                    f"step {step} loss {record.get('loss', float('nan')):.4f} "
                    f"grad_norm {record['grad_norm']:.3f} "
                    f"{record['tokens_per_s']:.0f} tok/s{note}"
                )
    finally:
        trainer.close()
