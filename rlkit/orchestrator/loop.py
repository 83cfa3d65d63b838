"""The orchestrator's main loop: one batch per step for the trainer, new weights to the servers.

`Orchestrator.build` wires the collaborators (environments, prompt stream, server pool, rollout
source, group processor, scheduler, metrics logger); `run` strings the rest together: `start`
brings the servers up (resume, the LoRA start, the step-0 eval), `step` runs one step, `finish`
the final eval, `shutdown` stops what `build` and `start` started.

Per step N (numbered from 1, as the trainer expects):
1. `scheduler.next_batch()` (the `orchestrator.scheduler` class; sync: the whole batch; c3po: the
   shortest pool prefix with C >= Phi),
2. the orchestrator state for step N (sampler + prompts handed out but untrained,
   `rlkit.orchestrator.prompts`), then `write_batch` -> `batches/step_N.pt` (ringing the
   trainer),
3. sleep until the trainer rings (`rlkit.protocol.handoff`) with `weights/step_N/` published and
   its metrics in place; while it trains, c3po keeps generating,
4. load the version on every server as policy version N through its transport (each worker
   checks what it received against the version's tensor table; the phases of the update go to
   the step's `weight_update_<phase>_s`); c3po purges over-retained rollouts,
5. score the logprob canary on each server (`weights_canary_kl`; the run stops above
   `inference.canary_max_kl`) beside step N+1's rollouts, off the update's critical path: it is
   settled before step N+1's batch is written (no batch made under weights it refuses reaches
   the trainer), and then step N's metrics (merged with the trainer's) are logged; evaluate
   every `eval.every` steps (after the canary).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rlkit.envs.exploits import exploits_for
from rlkit.errors import RunStopped, UsageError
from rlkit.inference.canary import CanaryMismatch, pool_canary_kl
from rlkit.inference.pool import ClientPool
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.orchestrator.batching import GroupProcessor, make_batch
from rlkit.orchestrator.config import RolloutJobConfig, run_token
from rlkit.orchestrator.evaluation import evaluate
from rlkit.orchestrator.loggers import open_sinks, sample_rows
from rlkit.orchestrator.metrics import MetricsLogger, read_trainer_record, step_record
from rlkit.orchestrator.prompts import PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Group, Scheduler, scheduler_class
from rlkit.orchestrator.source import (
    EnvRolloutSource,
    load_environments,
    max_rollout_tokens,
)
from rlkit.orchestrator.state import save_state
from rlkit.orchestrator.watchdog import NoSignalWatchdog, watchdog_limits
from rlkit.progress import make_console
from rlkit.protocol import handoff
from rlkit.protocol.batch import write_batch
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.weights import CANARY_FILE, PublishedVersion, published_bytes
from rlkit.runs.rollout_errors import append_errors


class TrainerFailed(RuntimeError):
    """The trainer process exited or never published the step's weights."""


class TrainerNodeFailed(TrainerFailed, RunStopped):
    """A trainer node (another machine) reported that the trainer exited: the run stops with
    a one-line error; its latest checkpoint is where `--resume` continues."""


TRAINER_POLL_S = 0.5  # how often a step in progress checks that the trainer still lives
TRAINER_GRACE_S = 5.0  # how long a step may take to fail on its own once the trainer is gone
CANARY_POLL_S = 0.01  # how often the canary's wait looks for the trainer's file


def check_trainer(
    run_dir: Path,
    trainer_exit: Callable[[], int | None] | None,
    doing: str,
    *,
    clean_exit_ok: bool,
) -> None:
    """Raise if the trainer is gone: a trainer node (another machine) reported its failure
    through `run_dir`, or our own trainer child exited (with an error, or at all when the step
    still needs it: `clean_exit_ok=False`). `doing` ends the message ("before publishing ...")."""
    failure = handoff.trainer_failure(run_dir)
    if failure is not None:
        raise TrainerNodeFailed(
            f"{failure} {doing}; the latest checkpoint stays: restart the trainer nodes and the "
            "orchestrator with --resume"
        )
    code = trainer_exit() if trainer_exit is not None else None
    if code is not None and not (code == 0 and clean_exit_ok):
        raise TrainerFailed(f"the trainer exited with code {code} {doing}")


async def while_trainer_lives(
    work: Coroutine[Any, Any, None],
    run_dir: Path,
    trainer_exit: Callable[[], int | None] | None,
    doing: str,
) -> None:
    """Await `work`, failing soon after the trainer fails: a step waiting for what only the
    trainer brings (a server rejoins once the trainer republishes its version) would otherwise
    sit out its own timeout, e.g. `inference.recover_timeout_s`, after the trainer died. The step
    gets `TRAINER_GRACE_S` to fail on its own first: its error (a transport that saw the
    trainer go) says more."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=TRAINER_POLL_S)
            if task.done():
                break
            try:
                check_trainer(run_dir, trainer_exit, doing, clean_exit_ok=True)
            except TrainerFailed:
                await asyncio.wait({task}, timeout=TRAINER_GRACE_S)
                if not task.done():
                    raise
        task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})


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
        check_trainer(run_dir, trainer_exit, f"before publishing {path}", clean_exit_ok=False)
        return False

    if not await doorbell.wait_async(published, timeout=timeout_s):
        raise TrainerFailed(
            f"no weights at {path} after {timeout_s:.0f}s (orchestrator.weights_timeout_s)"
        )
    return path


async def wait_for_canary(
    path: Path,
    run_dir: Path,
    timeout_s: float,
    trainer_exit: Callable[[], int | None] | None,
) -> None:
    """Until the trainer's canary of the version in `path` is written (`Trainer.publish_canary`:
    after the version's tensors, while the servers load them; a few milliseconds after the
    update at the tiny size); fail if the trainer died. An adapter has no record and no canary.
    Polls the file: the run's doorbell has one waiter, the step's wait for the next version."""
    deadline = time.monotonic() + timeout_s
    if PublishedVersion.read(path) is None:
        return
    while not (path / CANARY_FILE).exists():
        check_trainer(
            run_dir, trainer_exit, f"before scoring the canary of {path}", clean_exit_ok=False
        )
        if time.monotonic() > deadline:
            raise TrainerFailed(
                f"no canary in {path} after {timeout_s:.0f}s (orchestrator.weights_timeout_s)"
            )
        await asyncio.sleep(CANARY_POLL_S)


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


@dataclass(eq=False)  # one run: compared by identity
class Orchestrator:
    """One run's collaborators and the step that uses them; made by `build`, driven by `run`."""

    cfg: RolloutJobConfig
    envs: dict[str, Any]
    prompts: PromptStream
    pool: ClientPool
    source: EnvRolloutSource
    processor: GroupProcessor
    scheduler: Scheduler
    logger: MetricsLogger
    start_step: int
    trainer_exit: Callable[[], int | None] | None
    console: Console
    run_dir: Path = field(init=False)
    model: str = field(init=False)  # the `model` requests name
    done: int = field(init=False)  # last step whose weights are published
    doorbell: handoff.Doorbell = field(init=False)
    monitor: asyncio.Task | None = field(init=False, default=None)
    evals: dict[int, dict[str, Any]] = field(init=False, default_factory=dict)
    update_phases: dict[str, float] = field(init=False, default_factory=dict)  # the last update's
    # the last update's canary, running beside the next step's rollouts, with its step's record
    pending_canary: tuple[asyncio.Task, dict[str, Any], Any] | None = field(
        init=False, default=None
    )

    def __post_init__(self) -> None:
        self.run_dir = Path(self.cfg.log.run_dir)
        self.model = served_model(self.cfg)
        self.done = self.start_step
        self.doorbell = handoff.Doorbell(self.run_dir, handoff.ORCHESTRATOR)

    @classmethod
    def build(
        cls,
        cfg: RolloutJobConfig,
        urls: list[str],
        *,
        start_step: int = 0,
        state: dict[str, Any] | None = None,
        envs: dict[str, Any] | None = None,
        trainer_exit: Callable[[], int | None] | None = None,
        console: Console | None = None,
    ) -> Orchestrator:
        """Wire the run: `state` is the saved orchestrator state when resuming at `start_step`."""
        console = console or make_console(stderr=True)
        o = cfg.orchestrator  # the launcher created the run directory (`RunLayout.create`)
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
        source = EnvRolloutSource(envs, pool, model, o.sampling, o.group_size)
        processor = GroupProcessor(
            advantage=o.advantage,
            advantage_params=o.advantage_params,
            drop_zero_advantage=o.drop_zero_advantage,
            solve_threshold=o.difficulty.solve_threshold,
            sampler=sampler,
            watchdog=NoSignalWatchdog(
                *watchdog_limits(o, max_rollout_tokens(envs, o)), console=console
            ),
            detectors={env_id: exploits_for(env) for env_id, env in envs.items()},
        )
        scheduler = scheduler_class(o.scheduler).from_config(
            cfg, source, processor, prompts, version=start_step
        )
        logger = MetricsLogger(
            Path(cfg.log.run_dir),
            console,
            plot=cfg.log.plot,
            plot_every_s=cfg.log.plot_every_s,
            sinks=open_sinks(cfg.log, cfg.model_dump(mode="json")),
            samples_every=cfg.log.samples_every,
        )
        return cls(
            cfg=cfg,
            envs=envs,
            prompts=prompts,
            pool=pool,
            source=source,
            processor=processor,
            scheduler=scheduler,
            logger=logger,
            start_step=start_step,
            trainer_exit=trainer_exit,
            console=console,
        )

    async def run(self) -> dict[str, Any]:
        """Steps `start_step+1 .. max_steps`; returns {"eval": {step: summaries}}."""
        try:
            trainer = (self.run_dir, self.trainer_exit)
            await while_trainer_lives(self.start(), *trainer, "while the run started")
            for step in range(self.start_step + 1, self.cfg.orchestrator.max_steps + 1):
                await while_trainer_lives(self.step(step), *trainer, f"during step {step}")
            await self.finish()
        except RunStopped as exc:  # no signal, a canary mismatch, servers or the trainer lost
            await self.stop(str(exc))
            raise  # the last published step's state was saved with its batch (step 0's at start)
        finally:
            await self.shutdown()
        return {"eval": self.evals}

    async def start(self) -> None:
        """Servers healthy and watched; the policy the first step samples from in place."""
        cfg, o = self.cfg, self.cfg.orchestrator
        if o.return_routing:
            await require_routing(self.pool)
        await self.pool.wait_healthy(cfg.inference.startup_timeout_s)
        self.monitor = asyncio.create_task(self.pool.monitor())  # brings lost servers back
        if self.start_step:
            resumed = RunLayout(self.run_dir).weights_version(self.start_step)
            await self.update_weights(resumed, self.start_step)
            self.console.print(
                f"resuming at step {self.start_step + 1} (policy version {self.start_step})"
            )
        else:
            if cfg.model.lora.enabled:  # the trainer publishes the initial adapter as step 0
                await self.source.update_weights(str(await self.wait_for_weights(0)), 0)
            self.save(0)  # the stream's start: where a stop before the first batch resumes
            if o.eval.at_start:
                await self.evaluate(0)
        self.scheduler.take_idle_s()
        # what is loaded by now lives for the whole run: frozen out of the collector's sight,
        # full collections scan only the steps' objects (in `rlkit eval`, scanning the start-up
        # objects paused the event loop: docs/benchmarks.md)
        gc.freeze()

    async def step(self, step: int) -> None:
        """Step N: batch to the trainer, its weights to the servers, the step's metrics logged."""
        t0 = time.monotonic()
        groups: list[Group] = []
        while not groups:  # every group may have been filtered out (no signal)
            groups = await self.scheduler.next_batch()
        rollout_s = time.monotonic() - t0
        await self.settle_canary()  # no batch made under weights the canary refuses is trained
        batch = make_batch(step, groups, self.scheduler.version, self.prompts.take_dropped())
        # the stream as of this batch, saved before the trainer can see the batch: a trainer
        # checkpoint at step N always finds step N's state, wherever a SIGKILL lands
        self.save(step)
        write_batch(batch, self.run_dir)
        handoff.ring(self.run_dir, handoff.TRAINER)
        t1 = time.monotonic()
        path = await self.wait_for_weights(step)
        t2 = time.monotonic()
        await self.deliver_weights(path, step)
        weight_update_s = time.monotonic() - t2
        self.scheduler.on_policy_update(step)
        stats = self.processor.take_stats()
        append_errors(self.run_dir, [{**r, "step": step} for r in stats.error_records])
        ours = step_record(
            step,
            batch,
            stats,
            self.scheduler.take_counters(),
            rollout_time_s=rollout_s,
            train_time_s=time.monotonic() - t1,
            weights_wait_s=t2 - t1,
            weight_update_s=weight_update_s,
            step_time_s=time.monotonic() - t0,
            idle_s=self.scheduler.take_idle_s(),
        )
        ours.update(self.pool.metrics())
        ours.update(self.update_phases)
        ours["weight_update_bytes"] = float(published_bytes(path))
        samples = self.cfg.log.samples_per_step
        rows = sample_rows(groups, samples, step) if self.logger.samples_due(step) else None
        self.pending_canary = (
            asyncio.create_task(self.canary(path)),
            merge_records(ours, read_trainer_record(self.run_dir, step) or {}),
            rows,
        )
        self.done = step
        every, last = self.cfg.orchestrator.eval.every, self.cfg.orchestrator.max_steps
        if every and step % every == 0 and step != last:
            await self.settle_canary()
            await self.evaluate(step)

    async def canary(self, path: Path) -> tuple[float | None, float]:
        """The logprob canary of the weights in `path` on every server: (KL, seconds, the wait
        for the trainer's canary included)."""
        t0 = time.perf_counter()
        await wait_for_canary(
            path, self.run_dir, self.cfg.orchestrator.weights_timeout_s, self.trainer_exit
        )
        max_kl = self.cfg.inference.canary_max_kl
        kl = await pool_canary_kl(self.pool, self.model, path, max_kl, run_token(self.cfg))
        return kl, time.perf_counter() - t0

    async def settle_canary(self, logged: bool = True) -> None:
        """Wait for the last update's canary (it runs beside the next step's rollouts, off the
        update's critical path) and log that step's record with its `weights_canary_kl`.
        CanaryMismatch when the canary refuses the weights (the run then stops at the step
        before: its weights are the last the engines served right). `logged=False`: the run
        stops anyway: log the record with what is known, raise nothing."""
        if self.pending_canary is None:
            return
        task, record, rows = self.pending_canary
        self.pending_canary = None
        kl = seconds = None
        try:
            if not logged and not task.done():
                task.cancel()
            kl, seconds = await task
        except CanaryMismatch:
            self.done = int(record["step"]) - 1
            if logged:
                raise
        except (asyncio.CancelledError, Exception):
            if logged:
                raise
        finally:
            record["weights_canary_kl"] = kl
            record["weight_update_canary_s"] = seconds
            self.logger.log(record, rows)

    async def finish(self) -> None:
        """After the last step: the final eval, once nothing is in flight."""
        await self.settle_canary()
        if self.cfg.orchestrator.eval.at_end:
            await self.scheduler.close()
            await self.evaluate(self.cfg.orchestrator.max_steps)

    async def stop(self, reason: str) -> None:
        """Stop the run on `reason`: the trainer checkpoints the last published step and exits."""
        self.console.print(f"[bold red]stopping:[/] {reason}")
        await stop_with_checkpoint(self.run_dir, self.done, reason, self.trainer_exit, self.console)

    async def shutdown(self) -> None:
        """Stop everything `build` and `start` started; safe after a failure anywhere."""
        await self.settle_canary(logged=False)
        self.logger.draw_plot()
        self.doorbell.close()
        await self.scheduler.close()
        if self.cfg.model.lora.enabled:  # a shared server keeps serving other runs: free our slot
            await self.pool.unload_adapter()
        if self.monitor is not None:
            self.monitor.cancel()
        await self.pool.aclose()
        self.logger.close()

    async def update_weights(self, path: Path, version: int) -> float | None:
        """Load `path` on every server as policy `version`; returns the logprob canary's KL."""
        await self.deliver_weights(path, version)
        return (await self.canary(path))[0]

    async def deliver_weights(self, path: Path, version: int) -> None:
        """Load `path` on every server as policy `version` (no canary). Its phases go to
        `update_phases` (the step record's `weight_update_<phase>_s`: the whole delivery, and the
        slowest server's record check, pause, workers' receive / verify / reload, resume and
        the HTTP round trip beyond them)."""
        t0 = time.perf_counter()
        await self.source.update_weights(str(path), version)
        phases = {"deliver": time.perf_counter() - t0}
        update_seconds = getattr(self.pool, "update_seconds", None)
        phases.update(update_seconds() if update_seconds is not None else {})
        phases.pop("call", None)  # the delivery's, above
        self.update_phases = {f"weight_update_{k}_s": v for k, v in phases.items()}

    async def wait_for_weights(self, step: int) -> Path:
        return await wait_for_weights(
            self.doorbell,
            self.run_dir,
            step,
            self.cfg.orchestrator.weights_timeout_s,
            self.trainer_exit,
        )

    def save(self, step: int) -> None:
        """The prompt stream as of step N's batch: where `--resume` at N continues."""
        state = {"sampler": self.prompts.sampler.state_dict(), "prompts": self.prompts.state_dict()}
        save_state(self.run_dir, step, state)

    async def evaluate(self, step: int) -> None:
        o = self.cfg.orchestrator
        self.evals[step] = await evaluate(
            self.envs,
            self.pool,
            self.model,
            o.sampling,
            o.eval,
            step=step,
            run_dir=self.run_dir,
            solve_threshold=o.difficulty.solve_threshold,
            console=self.console,
        )
        self.logger.log_eval(step, self.evals[step])
