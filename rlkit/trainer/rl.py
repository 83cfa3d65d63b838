"""The RL trainer loop: wait for the orchestrator's batch, train on it, publish weights.

Protocol with the orchestrator (files under `run_dir`, `rlkit.protocol.layout`): batches are
numbered from 1; for step N the trainer waits for `batches/step_N.pt`, takes `mini_batches`
optimiser steps on it (pi_old recomputed first when `loss.old_policy = "recomputed"`) and
publishes `weights/step_N/` (marked published last), which becomes policy version N on the
servers. Metrics go to `trainer_metrics.jsonl`, one JSON object per step, written before the
weights. Each side rings the other's doorbell (`rlkit.protocol.handoff`) when its file is in
place, so neither sleep-polls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rlkit.errors import UsageError
from rlkit.progress import make_console
from rlkit.protocol import handoff
from rlkit.protocol.batch import TrainBatch, read_batch
from rlkit.protocol.credentials import token_from_env
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.routing import decode_routing
from rlkit.protocol.weights import PublishedVersion
from rlkit.trainer import dist
from rlkit.trainer.config import TrainerConfig
from rlkit.trainer.export import prune_weights
from rlkit.trainer.metrics_log import MetricsLog
from rlkit.trainer.packing import TokenSequence
from rlkit.trainer.trainer import Trainer
from rlkit.weights import TransportSettings, WeightTransport, transport_class
from rlkit.weights.filesystem import Filesystem

console = make_console(stderr=True)


def split_mini_batches(seqs: list[TokenSequence], n: int) -> list[list[TokenSequence]]:
    """`n` contiguous, near-equal mini-batches (groups stay together as far as sizes allow)."""
    n = max(1, min(n, len(seqs)))
    bounds = [round(i * len(seqs) / n) for i in range(n + 1)]
    return [seqs[bounds[i] : bounds[i + 1]] for i in range(n)]


def to_sequences(batch: TrainBatch) -> list[TokenSequence]:
    return [
        TokenSequence(
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
    path = RunLayout(run_dir).batch(step)
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


class Publisher:
    """The trainer's side of weight updates: the run's transport (`rlkit.weights`), held by the
    exporting rank, and files at checkpoint steps: they are what a resumed run loads first."""

    def __init__(self, trainer: Trainer, run_dir: Path) -> None:
        w = trainer.cfg.weights
        self.trainer = trainer
        self.run_dir = run_dir
        self.transport: WeightTransport | None = None
        self.files: WeightTransport | None = None
        if dist.is_main():
            settings = TransportSettings(
                params=w.transport_params,
                device=str(trainer.device),
                # torchrun's MASTER_ADDR is where this rank is reachable from other machines
                host=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                token=token_from_env(),
            )
            model_files = trainer.model_files()
            self.transport = transport_class(w.transfer)(settings, model_files)
            self.files = Filesystem(settings, model_files)

    def publish(self, step: int) -> None:
        """Collective: export policy version `step` (weights, or the LoRA adapter), tell the
        orchestrator, score its canary while the servers load it, and drop the oldest published
        versions."""
        out = RunLayout(self.run_dir).weights_version(step)
        interval = self.trainer.cfg.ckpt.interval
        transport = self.transport
        if interval and step % interval == 0:
            self.settle()
            transport = self.files
        self.trainer.export(out, extra={"step": step}, version=step, transport=transport)
        if dist.is_main():
            handoff.ring(self.run_dir, handoff.ORCHESTRATOR)
        self.trainer.publish_canary(out)
        if dist.is_main():
            prune_weights(self.run_dir, self.trainer.cfg.weights.keep_last)

    def signed_elsewhere(self, step: int) -> bool:
        """Collective: whether version `step`'s record was signed with another credential than
        this run's (decided on the exporting rank)."""
        elsewhere = 0.0
        if dist.is_main():
            record = PublishedVersion.read(RunLayout(self.run_dir).weights_version(step))
            token = token_from_env()
            elsewhere = float(bool(record and token and not record.signed_by(token)))
        return dist.all_reduce_sum([elsewhere])[0] > 0

    def settle(self) -> None:
        """The update in flight reaches the servers (bounded by the transport's timeout)."""
        if self.transport is not None:
            self.transport.settle()


def run_rl(cfg: TrainerConfig) -> None:
    """Train until `max_steps` (or forever), one orchestrator batch per step."""
    if cfg.optim.schedule == "cosine" and not cfg.max_steps:
        raise UsageError("optim.schedule = 'cosine' needs max_steps > 0 to know the horizon")
    run_dir = Path(cfg.run_dir)
    loss = cfg.loss.resolved
    trainer = Trainer(cfg, total_steps=cfg.max_steps)
    try:
        t_resume = time.perf_counter()
        step, _ = trainer.maybe_resume()
        resume_s = time.perf_counter() - t_resume
        # what the step's record leaves out, after its weights: publishing, checkpoints, resume
        costs = MetricsLog(RunLayout(run_dir).trainer_costs, step, enabled=dist.is_main())
        if step and dist.is_main():
            console.print(f"resumed from step {step}")
            costs.append({"step": step, "resume_s": resume_s})
        publisher = Publisher(trainer, run_dir) if cfg.weights.publish else None
        if not step and cfg.model.lora.enabled and publisher is not None:
            publisher.publish(0)  # the initial adapter (B = 0: the base's policy)
        if step and publisher is not None and publisher.signed_elsewhere(step):
            # resumed with another credential (on other servers): the servers refuse the old
            # signature, so the checkpoint's version is published again, signed with this one
            publisher.publish(step)
        metrics = MetricsLog(RunLayout(run_dir).trainer_metrics, step, enabled=dist.is_main())
        doorbell = handoff.Doorbell(run_dir, f"{handoff.TRAINER}{dist.rank()}")
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
                chunks, loss, [loss.normalizer(chunk) for chunk in chunks], loss.recomputes_old
            )
            record = {"step": step, **batch_stats(batch, step), **result.metrics}
            record["batch_wait_s"] = batch_wait_s  # idle: waiting for (and reading) the batch
            if dist.is_main():  # before the weights: the orchestrator reads both at once
                metrics.append(record)
            cost: dict[str, float] = {"step": step}
            t_cost = time.perf_counter()
            if publisher is not None:
                publisher.publish(step)
                cost["export_s"] = time.perf_counter() - t_cost
            if cfg.ckpt.interval and step % cfg.ckpt.interval == 0:
                t_cost = time.perf_counter()
                trainer.save_checkpoint(step, {"next_batch": step + 1})
                cost["checkpoint_s"] = time.perf_counter() - t_cost
            costs.append(cost)
            if dist.is_main():
                note = " [red]skipped (non-finite loss or grad)[/]" if result.skipped else ""
                console.print(
                    f"step {step} loss {record.get('loss', float('nan')):.4f} "
                    f"grad_norm {record['grad_norm']:.3f} "
                    f"{record['tokens_per_s']:.0f} tok/s{note}"
                )
        if publisher is not None:
            publisher.settle()  # the last version reaches the servers before we exit
        trainer.close(wait_for_peers=True)
    finally:
        trainer.close()
