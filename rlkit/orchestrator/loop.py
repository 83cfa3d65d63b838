"""The orchestrator's main loop: one batch per step for the trainer, new weights to the servers.

Per step N (numbered from 1, as the trainer expects):
1. `scheduler.next_batch()` (the `orchestrator.scheduler` class; sync: the whole batch; c3po: the
   shortest pool prefix with C >= Phi),
2. `write_batch` -> `batches/step_N.pt` (ringing the trainer), then the orchestrator
   state for step N (sampler + prompts handed out but untrained, `rlkit.orchestrator.prompts`),
3. sleep until the trainer rings (`rlkit.protocol.handoff`) with `weights/step_N/` published and
   its metrics in place; while it trains, c3po keeps generating,
4. load the version on every server as policy version N through its transport (each worker
   checks what it received against the version's tensor table), score the logprob canary on
   each (`weights_canary_kl`; the run stops above `inference.canary_max_kl`); c3po purges
   over-retained rollouts,
5. log the step's metrics (merged with the trainer's), evaluate every `eval.every` steps.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from rlkit.errors import RunStopped, UsageError
from rlkit.inference import ClientPool
from rlkit.inference.canary import pool_canary_kl
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.orchestrator.batching import GroupProcessor, make_batch
from rlkit.orchestrator.config import RolloutJobConfig, run_token
from rlkit.orchestrator.evaluation import evaluate
from rlkit.orchestrator.loggers import open_sinks, sample_rows
from rlkit.orchestrator.metrics import MetricsLogger, read_trainer_record, step_record
from rlkit.orchestrator.prompts import PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Group, scheduler_class
from rlkit.orchestrator.source import (
    EnvRolloutSource,
    load_environments,
    max_rollout_tokens,
)
from rlkit.orchestrator.state import save_state
from rlkit.orchestrator.watchdog import NoSignalWatchdog, watchdog_limits
from rlkit.protocol import handoff
from rlkit.protocol.batch import write_batch
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.weights import published_bytes


class TrainerFailed(RuntimeError):
    """The trainer process exited or never published the step's weights."""


class TrainerNodeFailed(TrainerFailed, RunStopped):
    """A trainer node (another machine) reported that the trainer exited: the run stops with
    a one-line error; its latest checkpoint is where `--resume` continues."""


async def wait_for_weights(
    doorbell: handoff.Doorbell,
    run_dir: Path,
    step: int,
    timeout_s: float,
    trainer_exit: Callable[[], int | None] | None,
) -> Path:
    """Sleep until the trainer rings after publishing step N's weights; fail if it died."""
    path = RunLayout(run_dir).weights_version(step)

    def published() -> bool:
        if handoff.is_published(path):
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


def served_model(cfg: RolloutJobConfig) -> str:
    """The `model` requests name: the run's LoRA adapter, or the served model path."""
    if cfg.model.lora.enabled:
        return cfg.model.lora.served_name(cfg.log.run_dir)
    return cfg.model.path


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
    prompts = PromptStream(sampler, state.get("prompts") if state is not None else None)
    model = served_model(cfg)
    pool = ClientPool(
        urls,
        recover_timeout_s=cfg.inference.recover_timeout_s,
        health_interval_s=cfg.inference.health_interval_s,
        log=lambda message: console.print(f"[yellow]{message}[/]"),
        timeout=cfg.inference.request_timeout_s,
        max_retries=cfg.inference.max_retries,
        adapter=model if cfg.model.lora.enabled else None,
        api_key=run_token(cfg),
    )
    if o.return_routing:
        await require_routing(pool)
    source = EnvRolloutSource(
        envs,
        pool,
        model,
        o.sampling,
        o.group_size,
    )
    processor = GroupProcessor(
        advantage=o.advantage,
        advantage_params=o.advantage_params,
        drop_zero_advantage=o.drop_zero_advantage,
        solve_threshold=o.difficulty.solve_threshold,
        sampler=sampler,
        watchdog=NoSignalWatchdog(
            *watchdog_limits(o, max_rollout_tokens(envs, o)), console=console
        ),
    )
    scheduler = scheduler_class(o.scheduler).from_config(
        cfg, source, processor, prompts, version=start_step
    )

    def save(step: int) -> None:
        saved = {"sampler": sampler.state_dict(), "prompts": prompts.state_dict()}
        save_state(run_dir, step, saved)

    logger = MetricsLogger(
        run_dir,
        console,
        plot=cfg.log.plot,
        plot_every_s=cfg.log.plot_every_s,
        sinks=open_sinks(cfg.log, cfg.model_dump(mode="json")),
        samples_every=cfg.log.samples_every,
    )
    evals: dict[int, dict[str, Any]] = {}

    async def run_eval(step: int) -> None:
        evals[step] = await evaluate(
            envs,
            pool,
            model,
            o.sampling,
            o.eval,
            step=step,
            run_dir=run_dir,
            solve_threshold=o.difficulty.solve_threshold,
            console=console,
        )

    doorbell = handoff.Doorbell(run_dir, handoff.ORCHESTRATOR)
    done = start_step  # last step whose weights are published
    monitor: asyncio.Task | None = None
    try:
        await pool.wait_healthy(cfg.inference.startup_timeout_s)
        monitor = asyncio.create_task(pool.monitor())  # brings servers that went down back
        if start_step:
            resumed = RunLayout(run_dir).weights_version(start_step)
            await source.update_weights(str(resumed), start_step)
            await pool_canary_kl(pool, model, resumed, cfg.inference.canary_max_kl)
            console.print(f"resuming at step {start_step + 1} (policy version {start_step})")
        else:
            if cfg.model.lora.enabled:  # the trainer publishes the initial adapter as step 0
                path = await wait_for_weights(
                    doorbell, run_dir, 0, o.weights_timeout_s, trainer_exit
                )
                await source.update_weights(str(path), 0)
            save(0)  # the stream's start: where a stop before the first batch resumes
            if o.eval.at_start:
                await run_eval(0)
        scheduler.take_idle_s()
        # what is loaded by now lives for the whole run: frozen out of the collector's sight,
        # full collections scan only the steps' objects (in `rlkit eval`, scanning the start-up
        # objects paused the event loop: docs/benchmarks.md)
        gc.freeze()
        for step in range(start_step + 1, o.max_steps + 1):
            t0 = time.monotonic()
            groups: list[Group] = []
            while not groups:  # every group may have been filtered out (no signal)
                groups = await scheduler.next_batch()
            rollout_s = time.monotonic() - t0
            batch = make_batch(step, groups, scheduler.version, prompts.take_dropped())
            write_batch(batch, run_dir)
            handoff.ring(run_dir, handoff.TRAINER)
            save(step)  # no await since the batch was taken: the stream is as of this batch
            t1 = time.monotonic()
            path = await wait_for_weights(
                doorbell, run_dir, step, o.weights_timeout_s, trainer_exit
            )
            t2 = time.monotonic()
            await source.update_weights(str(path), step)
            canary = await pool_canary_kl(pool, model, path, cfg.inference.canary_max_kl)
            weight_update_s = time.monotonic() - t2
            scheduler.on_policy_update(step)
            t3 = time.monotonic()
            ours = step_record(
                step,
                batch,
                processor.take_stats(),
                scheduler.take_counters(),
                rollout_time_s=rollout_s,
                train_time_s=t3 - t1,
                weights_wait_s=t2 - t1,
                weight_update_s=weight_update_s,
                step_time_s=time.monotonic() - t0,
                idle_s=scheduler.take_idle_s(),
            )
            ours.update(pool.metrics())
            ours["weight_update_bytes"] = float(published_bytes(path))
            ours["weights_canary_kl"] = canary
            logger.log(
                merge_records(ours, read_trainer_record(run_dir, step) or {}),
                sample_rows(groups, cfg.log.samples_per_step, step)
                if logger.samples_due(step)
                else None,
            )
            done = step
            if o.eval.every and step % o.eval.every == 0 and step != o.max_steps:
                await run_eval(step)
        if o.eval.at_end:
            await scheduler.close()
            await run_eval(o.max_steps)
    except RunStopped as exc:  # no signal, a canary mismatch, servers or the trainer lost
        console.print(f"[bold red]stopping:[/] {exc}")
        await stop_with_checkpoint(run_dir, done, str(exc), trainer_exit, console)
        raise  # step `done`'s state was saved with its batch (step 0's at the start)
    finally:
        logger.draw_plot()
        doorbell.close()
        await scheduler.close()
        if cfg.model.lora.enabled:  # a shared server keeps serving other runs: free our slot
            await pool.unload_adapter()
        if monitor is not None:
            monitor.cancel()
        await pool.aclose()
        logger.close()
    return {"eval": evals}
