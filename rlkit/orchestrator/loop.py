"""The orchestrator's main loop: one batch per step for the trainer, new weights to the servers.

Per step N (numbered from 1, as the trainer expects):
1. `scheduler.next_batch()` (sync: the whole batch; c3po: the shortest pool prefix with C >= Phi),
2. `write_batch` -> `run_dir/batches/step_N.pt` (ringing the trainer), then the orchestrator
   state for step N,
3. sleep until the trainer rings (`rlkit.handoff`) with `weights/step_N/STABLE` and its metrics
   in place; while it trains, c3po keeps generating,
4. load the weights on every server as policy version N; c3po purges over-retained rollouts,
5. log the step's metrics (merged with the trainer's), evaluate every `eval.every` steps.

Sync does 4-5 before the next step. C3PO++ starts step N+1 (its batch is usually pooled already)
while the servers load N, and finishes 4-5 once batch N+1 is with the trainer: the trainer no
longer idles through the update. Staleness counts from the trainer's weights
(`scheduler.on_weights_published`); new rollouts start once the servers serve the new weights.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from rlkit import handoff
from rlkit.errors import RunStopped, UsageError
from rlkit.inference import ClientPool
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.orchestrator.batching import GroupProcessor, make_batch, sampling_temperature
from rlkit.orchestrator.config import RolloutJobConfig
from rlkit.orchestrator.evaluation import evaluate
from rlkit.orchestrator.metrics import MetricsLogger, read_trainer_record, step_record
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import C3POScheduler, Group, SyncScheduler
from rlkit.orchestrator.source import EnvRolloutSource, ServersLost, load_environments
from rlkit.orchestrator.state import save_state
from rlkit.orchestrator.watchdog import NoSignalError, NoSignalWatchdog
from rlkit.trainer.batch import TrainBatch, write_batch
from rlkit.trainer.export import STABLE_MARKER, weights_dir


@dataclass
class PublishedStep:
    """A step whose weights the trainer published and the servers are loading (`update`);
    logged once they are live. C3PO++ forms the next batch meanwhile."""

    step: int
    batch: TrainBatch
    stats: Any
    counters: Any
    t0: float  # the step started forming its batch
    t1: float  # batch handed to the trainer
    t2: float  # weights published
    rollout_s: float
    update: asyncio.Task[float]


class TrainerFailed(RuntimeError):
    """The trainer process exited or never published the step's weights."""


class TrainerNodeFailed(TrainerFailed, RunStopped):
    """A trainer node (another machine) reported that the trainer exited: the run stops with
    a one-line error; its latest checkpoint is where `--resume` continues."""


def make_scheduler(
    cfg: RolloutJobConfig, source: EnvRolloutSource, processor: GroupProcessor, version: int
) -> SyncScheduler | C3POScheduler:
    o = cfg.orchestrator
    if o.scheduler == "sync":
        return SyncScheduler(
            source,
            processor,
            batch_groups=o.batch_groups,
            max_off_policy_steps=o.max_off_policy_steps,
            version=version,
        )
    return C3POScheduler(
        source,
        processor,
        capacity=o.capacity,
        token_budget=o.token_budget,
        retention=o.retention,
        max_off_policy_steps=o.max_off_policy_steps,
        version=version,
    )


async def wait_for_weights(
    doorbell: handoff.Doorbell,
    run_dir: Path,
    step: int,
    timeout_s: float,
    trainer_exit: Callable[[], int | None] | None,
) -> Path:
    """Sleep until the trainer rings after publishing step N's weights; fail if it died."""
    path = weights_dir(run_dir, step)

    def published() -> bool:
        if (path / STABLE_MARKER).exists():
            return True
        failure = handoff.trainer_failure(run_dir)  # a trainer on other machines
        if failure is not None:
            raise TrainerNodeFailed(
                f"{failure} before publishing {path}; the latest checkpoint stays: restart the "
                "trainer nodes and the orchestrator with --resume"
            )
        code = trainer_exit() if trainer_exit is not None else None
        if code is not None:
            raise TrainerFailed(f"the trainer exited with code {code} before publishing {path}")
        return False

    if not await doorbell.wait_async(published, timeout=timeout_s):
        raise TrainerFailed(
            f"no weights at {path} after {timeout_s:.0f}s (orchestrator.weights_timeout_s)"
        )
    return path


async def stop_with_checkpoint(
    run_dir: Path,
    step: int,
    reason: str,
    trainer_exit: Callable[[], int | None] | None,
    console: Console,
    timeout_s: float = 600.0,
) -> None:
    """Ask the trainer to checkpoint step `step` and exit; wait for it when it is our child."""
    handoff.request_stop(run_dir, reason)
    if trainer_exit is None:  # another machine's trainer: it sees the request on its own
        return
    deadline = time.monotonic() + timeout_s
    while trainer_exit() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    code = trainer_exit()
    if code == 0:
        console.print(f"checkpoint of step {step} written; continue with --resume")
    else:
        console.print(f"[red]the trainer did not confirm its checkpoint (exit {code})[/]")


def merge_records(ours: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
    """Trainer keys join the record; ones we already have are kept as `trainer/<key>`."""
    merged = dict(ours)
    for key, value in trainer.items():
        if key != "step":
            merged[f"trainer/{key}" if key in ours else key] = value
    return merged


def _wandb_run(cfg: RolloutJobConfig, console: Console) -> Any:
    if not cfg.log.wandb:
        return None
    try:
        import wandb
    except ImportError:
        console.print("[yellow]log.wandb = true but wandb is not installed; skipping W&B[/]")
        return None
    return wandb.init(
        project=cfg.log.wandb_project,
        dir=cfg.log.run_dir,
        config=cfg.model_dump(mode="json"),
        resume="allow",
    )


async def require_routing(pool: ClientPool) -> None:
    """R3: every server must return routed experts; ask each for them or refuse to start."""
    for client in pool.clients:
        source = await client.routing_source()
        if source is None:
            raise UsageError(
                f"routing_replay = 'r3' needs routed experts from the inference engine, but the "
                f"server at {client.base_url} does not return them: start it with "
                f"--enable-return-routed-experts (vLLM's V2 model runner, GPU) or "
                f"{CAPTURE_ROUTING_FLAG} (rlkit's capture, any vLLM incl. CPU)"
            )
        client.routing = True


async def run_orchestrator(
    cfg: RolloutJobConfig,
    urls: list[str],
    *,
    start_step: int = 0,
    state: dict[str, Any] | None = None,
    envs: dict[str, Any] | None = None,
    trainer_exit: Callable[[], int | None] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run steps `start_step+1 .. max_steps`; returns {"eval": {step: summaries}}."""
    console = console or Console(stderr=True)
    o = cfg.orchestrator
    run_dir = Path(cfg.log.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.sandbox.apply()
    envs = envs if envs is not None else load_environments(cfg.env)
    sampler = PromptSampler(
        {env_id: len(env.get_dataset()) for env_id, env in envs.items()},
        {spec.id: spec.weight for spec in cfg.env},
        o.difficulty,
        seed=o.seed,
    )
    if state is not None:
        sampler.load_state_dict(state["sampler"])
    pool = ClientPool(
        urls,
        recover_timeout_s=cfg.inference.recover_timeout_s,
        health_interval_s=cfg.inference.health_interval_s,
        log=lambda message: console.print(f"[yellow]{message}[/]"),
        timeout=cfg.inference.request_timeout_s,
        max_retries=cfg.inference.max_retries,
    )
    if o.return_routing:
        await require_routing(pool)
    source = EnvRolloutSource(
        envs,
        sampler,
        pool,
        cfg.model.path,
        o.sampling,
        o.group_size,
    )
    processor = GroupProcessor(
        advantage=o.advantage,
        advantage_params=o.advantage_params,
        drop_zero_advantage=o.drop_zero_advantage,
        solve_threshold=o.difficulty.solve_threshold,
        sampler=sampler,
        watchdog=NoSignalWatchdog(*o.watchdog_limits(), console=console),
        temperatures={
            env_id: sampling_temperature(env, o.sampling) for env_id, env in envs.items()
        },
    )
    scheduler = make_scheduler(cfg, source, processor, version=start_step)
    logger = MetricsLogger(
        run_dir,
        console,
        plot=cfg.log.plot,
        plot_every_s=cfg.log.plot_every_s,
        wandb_run=_wandb_run(cfg, console),
    )
    evals: dict[int, dict[str, Any]] = {}

    async def run_eval(step: int) -> None:
        evals[step] = await evaluate(
            envs,
            pool,
            cfg.model.path,
            o.sampling,
            o.eval,
            step=step,
            run_dir=run_dir,
            solve_threshold=o.difficulty.solve_threshold,
            console=console,
        )

    async def update_servers(path: str, step: int) -> float:
        """Load step's weights on every server; returns the seconds it took."""
        t = time.monotonic()
        try:
            await source.update_weights(path, step)
        except Exception as exc:
            scheduler.stop(exc)  # a next batch waiting on new rollouts would wait forever
            raise
        scheduler.on_policy_update(step)
        return time.monotonic() - t

    async def finish_step(
        published: PublishedStep, next_start: float | None, evaluate_due: bool = True
    ) -> None:
        """Wait for the step's weight update, log the step, evaluate when due. The step ends
        where the next one started (`next_start`) or now."""
        weight_update_s = await published.update
        t3 = time.monotonic()
        step = published.step
        ours = step_record(
            step,
            published.batch,
            published.stats,
            published.counters,
            rollout_time_s=published.rollout_s,
            train_time_s=t3 - published.t1,
            weights_wait_s=published.t2 - published.t1,
            weight_update_s=weight_update_s,
            step_time_s=(next_start or time.monotonic()) - published.t0,
            idle_s=scheduler.take_idle_s(),
        )
        ours.update(pool.metrics())
        logger.log(merge_records(ours, read_trainer_record(run_dir, step) or {}))
        if evaluate_due and o.eval.every and step % o.eval.every == 0 and step != o.max_steps:
            await run_eval(step)

    doorbell = handoff.Doorbell(run_dir, handoff.ORCHESTRATOR)
    done = start_step  # last step whose weights are published
    pending: PublishedStep | None = None  # its weights are loading on the servers
    monitor: asyncio.Task | None = None
    try:
        await pool.wait_healthy(cfg.inference.startup_timeout_s)
        monitor = asyncio.create_task(pool.monitor())  # brings servers that went down back
        if start_step:
            await source.update_weights(str(weights_dir(run_dir, start_step)), start_step)
            console.print(f"resuming at step {start_step + 1} (policy version {start_step})")
        elif o.eval.at_start:
            await run_eval(0)
        scheduler.take_idle_s()
        # what is loaded by now lives for the whole run: frozen out of the collector's sight,
        # full collections scan only the steps' objects (in `rlkit eval`, scanning the start-up
        # objects paused the event loop 0.2-0.4 s per 1,024 rollouts)
        gc.freeze()
        for step in range(start_step + 1, o.max_steps + 1):
            t0 = time.monotonic()
            groups: list[Group] = []
            while not groups:  # every group may have been filtered out (no signal)
                groups = await scheduler.next_batch()
            rollout_s = time.monotonic() - t0
            batch = make_batch(step, groups, scheduler.trained)
            write_batch(batch, run_dir)
            handoff.ring(run_dir, handoff.TRAINER)
            save_state(run_dir, step, {"sampler": sampler.state_dict()})
            if pending is not None:  # the previous step's update ran beside this batch
                await finish_step(pending, next_start=t0)
                pending = None
            t1 = time.monotonic()
            path = await wait_for_weights(
                doorbell, run_dir, step, o.weights_timeout_s, trainer_exit
            )
            t2 = time.monotonic()
            done = step
            scheduler.on_weights_published(step)
            pending = PublishedStep(
                step,
                batch,
                processor.take_stats(),
                scheduler.take_counters(),
                t0=t0,
                t1=t1,
                t2=t2,
                rollout_s=rollout_s,
                update=asyncio.create_task(update_servers(str(path), step)),
            )
            if not scheduler.overlaps_weight_updates or step == o.max_steps:
                await finish_step(pending, next_start=None)
                pending = None
        if o.eval.at_end:
            await scheduler.close()
            await run_eval(o.max_steps)
    except ServersLost as exc:
        console.print(f"[bold red]stopping:[/] {exc}")
        raise
    except NoSignalError as exc:
        console.print(f"[bold red]stopping:[/] {exc}")
        if pending is not None:  # the last published step still gets its metrics line
            await finish_step(pending, next_start=None, evaluate_due=False)
            pending = None
        await stop_with_checkpoint(run_dir, done, str(exc), trainer_exit, console)
        save_state(run_dir, done, {"sampler": sampler.state_dict()})
        raise
    finally:
        if pending is not None:
            pending.update.cancel()
        logger.draw_plot()
        doorbell.close()
        await scheduler.close()
        if monitor is not None:
            monitor.cancel()
        await pool.aclose()
        if logger.wandb_run is not None:
            logger.wandb_run.finish()
    return {"eval": evals}
