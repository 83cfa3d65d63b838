"""sync vs C3PO++ on a long-tail workload: rollout-phase and end-to-end time per step.

Both schedulers run the same workload (completion lengths drawn from a lognormal with a heavy
tail, capped at max_tokens), the same engine and the same per-step budget:
sync trains on `batch_groups` groups of G; c3po gets Phi = the expected tokens of such a batch
and Omega = the same number of rollouts in flight. The trainer step is simulated by a sleep
proportional to the batch's tokens (plus a weight update on the engine).

Engines (`--engine`):
- `sim` (default): a simulated continuous-batching engine: each decode tick advances every
  running sequence by one token and takes `tick_base + tick_per_seq * running` seconds, at most
  `max_num_seqs` sequences run at once; weight updates pause it for `update_s`.
- `vllm`: the real vLLM CPU server with a tiny model (`ignore_eos`, `max_tokens` drawn from the
  same distribution), weight updates through `/rlkit/update_weights` with the served checkpoint
  (published as a version by files).

    python tests/benchmarks/bench_scheduler.py [--engine sim|vllm] [--steps 8]

Prints one JSON line with both schedulers' per-step times and the sync/c3po ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rlkit.envs import Rollout, Turn
from rlkit.orchestrator.batching import GroupProcessor
from rlkit.orchestrator.config import DifficultyConfig
from rlkit.orchestrator.prompts import Prompt, PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import C3POScheduler, SyncScheduler


class LongTail:
    """Completion lengths: lognormal (median `median`, shape `sigma`), capped at `cap`; a
    fraction `at_cap` of completions runs to the cap (Ring-1T's rollouts cut at the limit)."""

    def __init__(
        self, median: float, sigma: float, cap: int, seed: int, at_cap: float = 0.0
    ) -> None:
        self.rng = random.Random(seed)
        self.median, self.sigma, self.cap, self.at_cap = median, sigma, cap, at_cap

    def _draw(self, rng: random.Random) -> int:
        if rng.random() < self.at_cap:
            return self.cap
        return max(1, min(self.cap, int(rng.lognormvariate(0, self.sigma) * self.median)))

    def draw(self) -> int:
        return self._draw(self.rng)

    def mean(self, n: int = 200_000) -> float:
        rng = random.Random(12345)
        return statistics.fmean(self._draw(rng) for _ in range(n))


class SimEngine:
    """Continuous batching with a per-tick cost that grows with the running sequences."""

    def __init__(self, tick_base: float, tick_per_seq: float, max_num_seqs: int, update_s: float):
        self.tick_base, self.tick_per_seq = tick_base, tick_per_seq
        self.max_num_seqs, self.update_s = max_num_seqs, update_s
        self.version = 0
        self.running: list[list[Any]] = []  # [remaining tokens, future]
        self.waiting: list[list[Any]] = []
        self.paused = False
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()

    async def _loop(self) -> None:
        while True:
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.pop(0))
            if not self.running or self.paused:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(self.tick_base + self.tick_per_seq * len(self.running))
            for req in self.running:
                req[0] -= 1
            for req in [r for r in self.running if r[0] <= 0]:
                self.running.remove(req)
                if not req[1].done():
                    req[1].set_result(None)

    async def generate(self, tokens: int) -> tuple[int, int]:
        start = self.version
        future = asyncio.get_running_loop().create_future()
        req = [tokens, future]
        self.waiting.append(req)
        self._wake.set()
        try:
            await future
        except asyncio.CancelledError:  # purged: free the slot
            for queue in (self.running, self.waiting):
                if req in queue:
                    queue.remove(req)
            raise
        return start, self.version

    async def update_weights(self) -> None:
        self.paused = True
        await asyncio.sleep(self.update_s)
        self.version += 1
        self.paused = False
        self._wake.set()


class VLLMEngine:
    """The real vLLM CPU server with a tiny model; weight updates reload the same checkpoint."""

    def __init__(self, model_dir: Path, server: Any) -> None:
        from rlkit.inference.admin import AdminClient

        self.model = str(model_dir)
        self.client = server.client()
        self.admin = AdminClient(self.client)
        self.server = server

    async def start(self) -> None:
        await self.admin.status()

    async def stop(self) -> None:
        await self.client.aclose()

    async def generate(self, tokens: int) -> tuple[int, int]:
        gen = await self.client.completion(
            [5, 6, 7, 8],
            self.model,
            {"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 1.0},
        )
        return int(gen.policy_version_start or 0), int(gen.policy_version_end or 0)

    async def update_weights(self) -> None:
        await self.admin.update_weights(self.model)

    @property
    def version(self) -> int:
        return int(self.client.policy_version or 0)


class Source:
    """G rollouts of one (synthetic) prompt, lengths from the long-tail distribution."""

    def __init__(self, engine: Any, lengths: LongTail, group_size: int) -> None:
        self.engine, self.lengths, self.group_size = engine, lengths, group_size
        self.rng = random.Random(7)

    async def _rollout(self, n: int) -> Rollout:
        start, end = await self.engine.generate(n)
        turn = Turn(
            prompt_token_ids=[5, 6, 7, 8],
            completion_token_ids=[9] * n,
            completion_logprobs=[-1.0] * n,
            policy_version_start=start,
            policy_version_end=end,
        )
        return Rollout(turns=[turn], reward=self.rng.random())

    async def next_group(self, prompt: Prompt) -> list[Rollout]:
        lengths = [self.lengths.draw() for _ in range(self.group_size)]
        return list(await asyncio.gather(*(self._rollout(n) for n in lengths)))


async def run_scheduler(kind: str, engine: Any, args: argparse.Namespace) -> dict[str, float]:
    lengths = LongTail(args.median, args.sigma, args.max_tokens, args.seed, args.at_cap)
    source = Source(engine, lengths, args.group_size)
    processor = GroupProcessor(advantage="grpo", drop_zero_advantage=True, solve_threshold=1.0)
    budget = int(args.batch_groups * args.group_size * lengths.mean())
    prompts = PromptStream(PromptSampler({"bench": 1000}, {"bench": 1.0}, DifficultyConfig()))
    if kind == "sync":
        sched: Any = SyncScheduler(
            source,
            processor,
            prompts=prompts,
            batch_groups=args.batch_groups,
            max_off_policy_steps=10**6,
        )
    else:
        sched = C3POScheduler(
            source,
            processor,
            prompts=prompts,
            capacity=args.capacity_factor * args.batch_groups * args.group_size,
            token_budget=budget,
            retention=args.retention,
            max_off_policy_steps=10**6,
        )
    rollout_times, step_times, update_times, tokens = [], [], [], []
    version = engine.version
    for _ in range(args.steps):
        t0 = time.perf_counter()
        batch = await sched.next_batch()
        rollout_times.append(time.perf_counter() - t0)
        batch_tokens = sum(g.tokens for g in batch)
        tokens.append(batch_tokens)
        await asyncio.sleep(args.train_base_s + args.train_per_token_s * batch_tokens)
        t1 = time.perf_counter()
        await engine.update_weights()
        update_times.append(time.perf_counter() - t1)
        version += 1
        sched.on_policy_update(version)
        step_times.append(time.perf_counter() - t0)
    purged = sched.take_counters().purged
    await sched.close()
    return {
        "rollout_s_per_step": statistics.fmean(rollout_times),
        "step_s_per_step": statistics.fmean(step_times),
        "update_s_per_step": statistics.fmean(update_times),
        "tokens_per_step": statistics.fmean(tokens),
        "purged": purged,
        "budget": budget,
    }


async def warm_up(engine: VLLMEngine, args: argparse.Namespace) -> None:
    """Two untimed sync-sized bursts: the engine's first requests run slow, and without this
    round 1's sync rollouts (2.07 s/step against 1.74 and 1.68 s in rounds 2 and 3) inflated
    round 1's ratio."""
    lengths = LongTail(args.median, args.sigma, args.max_tokens, args.seed + 1, args.at_cap)
    await engine.start()
    try:
        for _ in range(2):
            n = args.batch_groups * args.group_size
            await asyncio.gather(*(engine.generate(lengths.draw()) for _ in range(n)))
    finally:
        await engine.stop()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    server = None
    if args.engine == "vllm":
        from rlkit.inference import start_server
        from rlkit.models import init_tiny
        from rlkit.protocol.credentials import TOKEN_FILE_ENV, ensure_token_file
        from tests.helpers.published import publish_files

        tmp = Path(tempfile.mkdtemp(prefix="bench-scheduler-"))
        # one credential for the server and the version record it loads (a record signed
        # with another token is refused: 403 on /rlkit/update_weights)
        token_file = tmp / "token"
        ensure_token_file(token_file)
        os.environ[TOKEN_FILE_ENV] = str(token_file)
        model_dir = publish_files(init_tiny(tmp / "model", arch="qwen3", size="tiny", seed=0))
        seqs = max(args.capacity_factor * args.batch_groups * args.group_size, 64)
        server = start_server(  # room for every rollout C3PO++ keeps in flight
            str(model_dir),
            log_path=tmp / "vllm.log",
            extra_args=["--max-num-seqs", str(seqs)],
            weights_roots=[tmp],
        )
        server.wait_ready(600)
        await warm_up(VLLMEngine(model_dir, server), args)
    runs: dict[str, list[dict[str, float]]] = {"sync": [], "c3po": []}
    try:
        for kind in ["sync", "c3po"] * args.rounds:  # interleaved: the machine may be shared
            if args.engine == "sim":
                engine: Any = SimEngine(
                    args.tick_base_s, args.tick_per_seq_s, args.max_num_seqs, args.update_s
                )
            else:
                engine = VLLMEngine(model_dir, server)
            await engine.start()
            try:
                runs[kind].append(await run_scheduler(kind, engine, args))
            finally:
                await engine.stop()
    finally:
        if server is not None:
            server.stop()
    results = {kind: mean_of(rs) for kind, rs in runs.items()}
    sync, c3po = results["sync"], results["c3po"]
    return {
        "benchmark": "scheduler_sync_vs_c3po",
        "engine": args.engine,
        "workload": {
            "lengths": f"lognormal(median={args.median}, sigma={args.sigma}) capped at "
            f"{args.max_tokens}, {args.at_cap:.0%} at the cap",
            "retention": args.retention,
            "capacity": args.capacity_factor * args.batch_groups * args.group_size,
            "group_size": args.group_size,
            "batch_groups": args.batch_groups,
            "steps": args.steps,
            "rounds": args.rounds,
        },
        "sync": sync,
        "c3po": c3po,
        "rollout_time_ratio_sync_over_c3po": sync["rollout_s_per_step"]
        / c3po["rollout_s_per_step"],
        "step_time_ratio_sync_over_c3po": sync["step_s_per_step"] / c3po["step_s_per_step"],
        "per_round_ratios": [
            {
                "rollout": s["rollout_s_per_step"] / c["rollout_s_per_step"],
                "step": s["step_s_per_step"] / c["step_s_per_step"],
            }
            for s, c in zip(runs["sync"], runs["c3po"], strict=True)
        ],
        "load_avg": os.getloadavg(),
    }


def mean_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each field averaged over the rounds."""
    return {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engine", choices=["sim", "vllm"], default="sim")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1, help="sync/c3po pairs, interleaved")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-groups", type=int, default=8)
    p.add_argument("--median", type=float, default=40.0, help="median completion tokens")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape (tail weight)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--at-cap", type=float, default=0.0, help="fraction of completions at the cap")
    p.add_argument("--retention", type=int, default=2, help="C3PO++ sigma")
    p.add_argument(
        "--capacity-factor", type=int, default=1, help="C3PO++ Omega in sync batches' rollouts"
    )
    p.add_argument("--tick-base-s", type=float, default=2e-3, help="sim: decode tick fixed cost")
    p.add_argument("--tick-per-seq-s", type=float, default=2e-5, help="sim: cost per sequence")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sim: engine batch limit")
    p.add_argument("--update-s", type=float, default=0.05, help="sim: weight update pause")
    p.add_argument("--train-base-s", type=float, default=0.2, help="simulated trainer: fixed")
    p.add_argument("--train-per-token-s", type=float, default=2e-5, help="simulated trainer")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
