"""One simulated training run: the real scheduler, group processor and batching on a `SimPool`.

`simulate_run` follows `rlkit.orchestrator.loop.run_orchestrator` step for step with the
engine and the trainer simulated: the scheduler named in the config (`scheduler_class`, built
by its own `from_config`) hands out prompts from a real `PromptStream`, the real
`GroupProcessor` turns groups into samples, `make_batch` builds each step's batch (staleness
per sample, the prompt ledger), the trainer "trains" for `train_base_s + train_per_token_s *
tokens` of virtual time while the scheduler keeps generating, every server pauses for the
weight update, then `on_policy_update` (C3PO++'s purge). With `run_dir`, the run leaves the
same records a real run does (batches, orchestrator states, metrics.jsonl,
trainer_metrics.jsonl), so `rlkit runs audit` checks its prompt ledger unmodified.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.orchestrator.batching import GroupProcessor, make_batch
from rlkit.orchestrator.config import RolloutJobConfig
from rlkit.orchestrator.metrics import step_record
from rlkit.orchestrator.prompts import PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Group, scheduler_class
from rlkit.orchestrator.state import save_state
from rlkit.protocol.batch import write_batch
from rlkit.protocol.layout import RunLayout
from rlkit.sim.clock import run_virtual
from rlkit.sim.config import SimConfig
from rlkit.sim.engine import SimPool
from rlkit.sim.source import SimSource
from rlkit.sim.workload import Lengths

DEFAULT_CAP = 65536


@dataclass
class Workload:
    """What every scheduler of one comparison shares: the cluster, lengths, token unit."""

    servers: int
    lengths: Lengths
    token_unit: int
    seed: int


def length_cap(cfg: RolloutJobConfig, sim: SimConfig) -> int:
    return sim.max_tokens or cfg.orchestrator.sampling.max_tokens or DEFAULT_CAP


def token_unit(sim: SimConfig, cap: int) -> int:
    return sim.token_unit or max(1, cap // 256)


@dataclass
class RunResult:
    """One scheduler's simulated run: per-step records and the run's summary."""

    scheduler: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    staleness: Counter[int] = field(default_factory=Counter)  # samples per staleness
    retention: Counter[int] = field(default_factory=Counter)  # trained groups per retention
    dropped: Counter[str] = field(default_factory=Counter)  # prompts dropped, by reason
    summary: dict[str, Any] = field(default_factory=dict)


def with_orchestrator(cfg: RolloutJobConfig, changes: dict[str, Any]) -> RolloutJobConfig:
    """`cfg` with `[orchestrator]` fields changed (tables merged key by key, a scheduler's
    table in `schedulers` too), validated again: the scheduler reads its validated parameters,
    not the raw tables."""
    data = cfg.model_dump()
    data["orchestrator"] = _merged(data["orchestrator"], changes)
    return type(cfg).model_validate(data)


def _merged(old: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(old)
    for key, value in changes.items():
        was = out.get(key)
        both = isinstance(was, dict) and isinstance(value, dict)
        out[key] = _merged(was, value) if both else value  # type: ignore[arg-type]
    return out


def scaled_config(cfg: RolloutJobConfig, unit: int) -> RolloutJobConfig:
    """The config the scheduler is built from: Phi and the length cap counted in record tokens
    (`token_unit`), so that the config's own checks (a rollout fits the budget) hold as they do
    in real tokens."""
    o = cfg.orchestrator
    budget = max(1, math.ceil(o.params_for("c3po").model_dump()["token_budget"] / unit))
    changes: dict[str, Any] = {"schedulers": {"c3po": {"token_budget": budget}}}
    if o.sampling.max_tokens:
        changes["sampling"] = {"max_tokens": max(1, math.ceil(o.sampling.max_tokens / unit))}
    return with_orchestrator(cfg, changes)


def _trainer_record(step: int, train_s: float, tokens: int) -> dict[str, Any]:
    return {"step": step, "simulated": True, "train_time_s": train_s, "trained_tokens": tokens}


async def _simulate(
    cfg: RolloutJobConfig,
    sim: SimConfig,
    work: Workload,
    scheduler_name: str,
    steps: int,
    run_dir: Path | None,
) -> RunResult:
    o = cfg.orchestrator
    loop = asyncio.get_running_loop()
    env_ids = [spec.id for spec in cfg.env] or ["sim"]
    weights = {spec.id: spec.weight for spec in cfg.env} or {"sim": 1.0}
    sampler = PromptSampler(
        {e: sim.dataset_size for e in env_ids}, weights, o.difficulty, seed=o.seed
    )
    prompts = PromptStream(sampler)
    pool = SimPool(work.servers, sim)
    source = SimSource(pool, work.lengths, o.group_size, work.token_unit, work.seed)
    processor = GroupProcessor(
        advantage=o.advantage,
        advantage_params=o.advantage_params,
        drop_zero_advantage=o.drop_zero_advantage,
        solve_threshold=o.difficulty.solve_threshold,
    )
    scheduler = scheduler_class(scheduler_name).from_config(
        scaled_config(cfg, work.token_unit), source, processor, prompts, version=0
    )
    result = RunResult(scheduler_name)
    layout = RunLayout(run_dir) if run_dir is not None else None

    def save(step: int) -> None:
        if run_dir is not None:
            saved = {"sampler": sampler.state_dict(), "prompts": prompts.state_dict()}
            save_state(run_dir, step, saved)

    lost = _lost_servers(sim, work.servers)
    save(0)
    scheduler.take_idle_s()
    start = loop.time()
    for step in range(1, steps + 1):
        if lost and step == sim.lose_at_step:
            loop.call_later(sim.lose_after_s, pool.lose, lost)
        if lost and step == sim.rejoin_at_step:
            pool.rejoin(lost)
        t0 = loop.time()
        groups: list[Group] = []
        while not groups:
            groups = await scheduler.next_batch()
        rollout_s = loop.time() - t0
        batch = make_batch(step, groups, scheduler.version, prompts.take_dropped())
        if run_dir is not None:
            write_batch(batch, run_dir)
        save(step)
        for group in groups:
            result.retention[scheduler.version - group.start_version] += 1
        result.staleness.update(batch.meta["staleness"])
        result.dropped.update(d["reason"] for d in batch.meta["dropped"])
        tokens = sum(r.usage["completion_tokens"] for g in groups for r in g.rollouts)
        t1 = loop.time()
        train_s = sim.train_base_s + sim.train_per_token_s * tokens
        await asyncio.sleep(train_s)
        t2 = loop.time()
        await pool.update_weights(step)
        scheduler.on_policy_update(step)
        t3 = loop.time()
        record = step_record(
            step,
            batch,
            processor.take_stats(),
            scheduler.take_counters(),
            rollout_time_s=rollout_s,
            train_time_s=t3 - t1,
            weights_wait_s=t2 - t1,
            weight_update_s=t3 - t2,
            step_time_s=t3 - t0,
            idle_s=scheduler.take_idle_s(),
        )
        # batch_tokens and tokens_per_s count record tokens (`token_unit` real ones each)
        record.update(
            trained_tokens=tokens, simulated_time_s=t3 - start, token_unit=work.token_unit
        )
        result.steps.append(record)
        if layout is not None:
            with layout.trainer_metrics.open("a") as f:
                f.write(json.dumps(_trainer_record(step, train_s, tokens)) + "\n")
            with layout.metrics.open("a") as f:
                f.write(json.dumps(record) + "\n")
    elapsed = loop.time() - start
    result.summary = _summary(result, pool.utilisation(elapsed), elapsed, prompts, sim)
    result.summary["failovers"] = pool.failovers
    await scheduler.close()
    return result


def _lost_servers(sim: SimConfig, servers: int) -> list[int]:
    """The servers lost at `lose_at_step`: every k-th, `lose_fraction` of them."""
    n = round(sim.lose_fraction * servers)
    if not n:
        return []
    return [round(i * servers / n) for i in range(n)]


def _summary(
    result: RunResult,
    engine: dict[str, float],
    elapsed: float,
    prompts: PromptStream,
    sim: SimConfig,
) -> dict[str, Any]:
    steps = result.steps
    step_s = [r["step_time_s"] for r in steps]
    trained = sum(r["trained_tokens"] for r in steps)
    train_s = [sim.train_base_s + sim.train_per_token_s * r["trained_tokens"] for r in steps]
    samples = sum(result.staleness.values())
    groups = sum(result.retention.values())
    return {
        "steps": len(steps),
        "step_s": statistics.fmean(step_s),
        "rollout_s": statistics.fmean(r["rollout_time_s"] for r in steps),
        "weight_update_s": statistics.fmean(r["weight_update_s"] for r in steps),
        "trained_tokens_per_step": trained / len(steps),
        "trained_tokens_per_s": trained / elapsed if elapsed > 0 else 0.0,
        "trainer_idle": 1.0 - sum(train_s) / elapsed if elapsed > 0 else 0.0,
        "engine_busy": engine["engine_busy"],
        "engine_occupancy": engine["engine_occupancy"],
        "generated_tokens": engine["generated_tokens"],
        "wasted_tokens": max(0.0, 1.0 - trained / engine["generated_tokens"])
        if engine["generated_tokens"]
        else 0.0,
        "staleness_mean": sum(k * n for k, n in result.staleness.items()) / max(samples, 1),
        "staleness": {str(k): n for k, n in sorted(result.staleness.items())},
        "retention_mean": sum(k * n for k, n in result.retention.items()) / max(groups, 1),
        "retention": {str(k): n for k, n in sorted(result.retention.items())},
        "rollouts_purged": sum(r["rollouts_purged"] for r in steps),
        "prompts_purged": result.dropped["purged"],
        "prompts_dropped": dict(sorted(result.dropped.items())),
        "rollouts_stale": sum(r["rollouts_stale"] for r in steps),
        "prompts_trained": groups,
        "prompts_owed_at_end": len(prompts.out),
        "simulated_s": elapsed,
    }


def simulate_run(
    cfg: RolloutJobConfig,
    sim: SimConfig,
    work: Workload,
    scheduler_name: str,
    *,
    steps: int | None = None,
    run_dir: str | Path | None = None,
    orchestrator: dict[str, Any] | None = None,
) -> RunResult:
    """Simulate `steps` (default orchestrator.max_steps) steps of one scheduler in virtual
    time; `orchestrator` changes fields of `[orchestrator]` (e.g.
    `{"schedulers": {"c3po": {"capacity": N}}}`:
    Phi, Omega, sigma)."""
    # the scheduler's own parameters are validated for the one the config names
    cfg = with_orchestrator(cfg, {"scheduler": scheduler_name, **(orchestrator or {})})
    path = Path(run_dir) if run_dir is not None else None
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    return run_virtual(
        _simulate(cfg, sim, work, scheduler_name, steps or cfg.orchestrator.max_steps, path)
    )
