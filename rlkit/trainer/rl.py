"""The RL trainer loop: wait for the orchestrator's batch, train on it, publish weights.

Protocol with the orchestrator (files under `run_dir`): batches are numbered from 1; for step
N the trainer waits for `batches/step_{N:06d}.pt`, takes `mini_batches` optimiser steps on it
(pi_prox recomputed first when `loss.recompute_old_logprobs`) and publishes
`weights/step_{N:06d}/` (STABLE marker last), which becomes policy version N on the servers.
Metrics go to `trainer_metrics.jsonl`, one JSON object per step, written before the weights.
Each side rings the other's doorbell (`rlkit.handoff`) when its file is in place, so neither
sleep-polls.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from torch import Tensor

from rlkit import handoff
from rlkit.errors import UsageError
from rlkit.registry import Entry
from rlkit.trainer import dist
from rlkit.trainer.batch import TrainBatch, batch_path, read_batch
from rlkit.trainer.broadcaster import Broadcaster
from rlkit.trainer.config import LossConfig, TrainerConfig
from rlkit.trainer.engine import LossFn, Trainer
from rlkit.trainer.export import prune_weights, weights_dir
from rlkit.trainer.loss import LossParams, compute_policy_loss, loss_correction, resolve_loss
from rlkit.trainer.metrics_log import MetricsLog
from rlkit.trainer.packing import MicroBatch, Sequence
from rlkit.trainer.routing import decode_routing

console = Console(stderr=True)


def resolve_loss_config(cfg: LossConfig) -> tuple[Entry, LossParams]:
    """The registered loss and its parameters, checked up front (not at the first batch)."""
    try:
        return resolve_loss(cfg.name, cfg.params)
    except ValueError as exc:
        raise UsageError(f"loss: {exc}") from exc


def batch_normalizer(seqs: list[Sequence], agg: str) -> float:
    """Global count the loss divides by: counted tokens, or sequences with any counted token."""
    if agg == "token-mean":
        count = sum(sum(s.loss_mask[1:]) for s in seqs)
    else:
        count = sum(1 for s in seqs if any(s.loss_mask[1:]))
    return float(max(count, 1))


def split_mini_batches(seqs: list[Sequence], n: int) -> list[list[Sequence]]:
    """`n` contiguous, near-equal mini-batches (groups stay together as far as sizes allow)."""
    n = max(1, min(n, len(seqs)))
    bounds = [round(i * len(seqs) / n) for i in range(n + 1)]
    return [seqs[bounds[i] : bounds[i + 1]] for i in range(n)]


def make_rl_loss(cfg: LossConfig) -> LossFn:
    """The configured loss on one micro-batch, dividing by the global normaliser.

    `prox` is pi_prox from the recomputation pass, or None: then the losses with a fixed
    behaviour correction (icepop, tis) take the detached current policy (single-step form,
    r = 1 in value) and the others the engine's logprobs as their old policy (k = 1).
    """
    entry, params = resolve_loss_config(cfg)
    correction = loss_correction(entry, cfg.behaviour_correction)
    single_step = "correction" in entry.options

    def loss_fn(
        mb: MicroBatch, logprobs: Tensor, prox: Tensor | None, entropy: Tensor, normalizer: float
    ) -> tuple[Tensor, dict]:
        d = logprobs.device
        inference = mb.inference_logprobs.to(d)
        if prox is not None:
            old = prox
        else:
            old = logprobs.detach() if single_step else inference
        return compute_policy_loss(
            entry,
            params,
            correction,
            logprobs,
            old,
            inference,
            mb.advantages.to(d),
            mb.loss_mask.to(d),
            normalizer=normalizer,
            entropy=entropy,
            trainer_logprobs=logprobs if prox is None else prox,
        )

    return loss_fn


def to_sequences(batch: TrainBatch) -> list[Sequence]:
    return [
        Sequence(
            s.token_ids,
            s.loss_mask,
            s.inference_logprobs,
            s.advantage,
            s.temperature,
            decode_routing(s.routing, s.routing_dims) if s.routing is not None else None,
        )
        for s in batch.samples
    ]


def wait_for_batch(
    run_dir: str | Path, step: int, timeout_s: float, doorbell: handoff.Doorbell
) -> TrainBatch | None:
    """Block until the orchestrator's batch for `step` exists (it rings us), then read it.

    None: the orchestrator asked the run to stop (`handoff.request_stop`) instead.
    """
    path = batch_path(run_dir, step)
    start = time.monotonic()

    def ready() -> bool:
        return path.exists() or handoff.stop_requested(run_dir)

    if not path.exists():
        with console.status(f"waiting for {path}") as status:
            while not doorbell.wait(ready, timeout=1.0):
                waited = time.monotonic() - start
                if waited > timeout_s:
                    raise TimeoutError(
                        f"no batch {path} after {timeout_s:.0f}s (is the orchestrator running? "
                        "raise batch_timeout_s to wait longer)"
                    )
                status.update(f"waiting for {path} ({waited:.0f}s)")
    if not path.exists():
        return None
    return read_batch(path)


def batch_stats(batch: TrainBatch, step: int) -> dict[str, float]:
    versions = [s.policy_version for s in batch.samples]
    return {
        "samples": float(len(batch.samples)),
        "reward_mean": sum(s.reward for s in batch.samples) / len(batch.samples),
        "staleness_mean": sum(step - 1 - v for v in versions) / len(versions),
        "staleness_max": float(max(step - 1 - v for v in versions)),
    }


def publish(
    trainer: Trainer, run_dir: Path, step: int, broadcaster: Broadcaster | None = None
) -> None:
    """Collective: export policy version `step` (weights, or the LoRA adapter), tell the
    orchestrator, and drop the oldest published versions. With a `broadcaster`, the version
    is sent over the broadcast group, except at checkpoint steps: their files are what a
    resumed run loads first."""
    interval = trainer.cfg.ckpt.interval
    if broadcaster is not None and not (interval and step % interval == 0):
        broadcaster.publish(trainer, weights_dir(run_dir, step), step, extra={"step": step})
    else:
        if broadcaster is not None:
            broadcaster.wait()
        trainer.export(weights_dir(run_dir, step), extra={"step": step})
    if dist.is_main():
        handoff.ring(run_dir, handoff.ORCHESTRATOR)
        prune_weights(run_dir, trainer.cfg.weights.keep_last)


def run_rl(cfg: TrainerConfig) -> None:
    """Train until `max_steps` (or forever), one orchestrator batch per step."""
    if cfg.optim.schedule == "cosine" and not cfg.max_steps:
        raise UsageError("optim.schedule = 'cosine' needs max_steps > 0 to know the horizon")
    agg = resolve_loss_config(cfg.loss)[1].agg
    run_dir = Path(cfg.run_dir)
    loss_fn = make_rl_loss(cfg.loss)
    trainer = Trainer(cfg, total_steps=cfg.max_steps)
    try:
        step, _ = trainer.maybe_resume()
        if step and dist.is_main():
            console.print(f"resumed from step {step}")
        if not step and cfg.model.lora.enabled and cfg.weights.publish:
            publish(trainer, run_dir, 0)  # the initial adapter (B = 0: the base's policy)
        metrics = MetricsLog(run_dir / "trainer_metrics.jsonl", step, enabled=dist.is_main())
        doorbell = handoff.Doorbell(run_dir, f"{handoff.TRAINER}{dist.rank()}")
        w = cfg.weights
        broadcaster = (
            Broadcaster(w.broadcast_timeout_s, w.broadcast_bucket_mb, str(trainer.device))
            if w.publish and w.transfer == "broadcast"
            else None
        )
        while not cfg.max_steps or step < cfg.max_steps:
            step += 1
            t_wait = time.perf_counter()
            batch = wait_for_batch(run_dir, step, cfg.batch_timeout_s, doorbell)
            batch_wait_s = time.perf_counter() - t_wait
            if batch is None:  # the orchestrator stops the run: make it resumable here
                trainer.save_checkpoint(step - 1, {"next_batch": step})
                if dist.is_main():
                    console.print(f"stop requested: checkpoint of step {step - 1} written")
                break
            chunks = split_mini_batches(to_sequences(batch), cfg.mini_batches)
            result = trainer.train_steps(
                chunks,
                loss_fn,
                [batch_normalizer(chunk, agg) for chunk in chunks],
                cfg.loss.recompute_old_logprobs,
            )
            record = {"step": step, **batch_stats(batch, step), **result.metrics}
            record["batch_wait_s"] = batch_wait_s  # idle: waiting for (and reading) the batch
            if dist.is_main():  # before the weights: the orchestrator reads both at once
                metrics.append(record)
            if cfg.weights.publish:
                publish(trainer, run_dir, step, broadcaster)
            if cfg.ckpt.interval and step % cfg.ckpt.interval == 0:
                trainer.save_checkpoint(step, {"next_batch": step + 1})
            if dist.is_main():
                note = " [red]skipped (non-finite loss or grad)[/]" if result.skipped else ""
                console.print(
                    f"step {step} loss {record.get('loss', float('nan')):.4f} "
                    f"grad_norm {record['grad_norm']:.3f} "
                    f"{record['tokens_per_s']:.0f} tok/s{note}"
                )
        if broadcaster is not None:
            broadcaster.wait()  # the last version reaches the servers before we exit
        trainer.close(wait_for_peers=True)
    finally:
        trainer.close()
