"""Trainer step time beside a vLLM CPU server: vLLM's 1 s busy-wait vs the fixes, and the
engine's OpenMP threads spinning while both work.

    python tests/benchmarks/bench_contention.py [--steps 6] [--size tiny] [--overlap]

In this one process: a trainer (the tiny model, a demo-sized batch of 96 short sequences) and one
server per variant, all started up front. Each round runs, in rotating order, a step alone and,
per variant, a burst of 96 generations on that variant's server followed by a timed trainer step
(what `rlkit train` does each step), so every variant sees the same machine load. Besides wall
times it reports the server's CPU seconds during the step (spinning shows up there). Variants:
`vllm-default` (the worker spins 1 s after each message), `busy-loop-5ms` (rlkit's patch,
`RLKIT_VLLM_BUSY_LOOP_S=0.005`, the `rlkit train` default on CPU), `nice-19` (vLLM's spin at
the lowest CPU priority). Prints one JSON line: median step time per variant, its ratio to the
step alone, and each variant's generation time per burst.

`--overlap` times what C3PO++ does instead: a longer burst (64-token completions) runs while
the trainer steps beside it, until the burst ends; per variant it reports the burst's time,
the trainer's mean step time during it and the server's CPU seconds. Variant `omp-passive`
adds `OMP_WAIT_POLICY=PASSIVE` to the engine (its OpenMP threads sleep between parallel
regions instead of spinning in libgomp's barrier).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from rlkit.inference import ServerProcess, start_server
from rlkit.inference.polling import ENV_VAR
from rlkit.models import init_tiny
from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence
from rlkit.trainer.trainer import Trainer

VARIANTS = {
    "vllm-default": ({}, 0),
    "busy-loop-5ms": ({ENV_VAR: "0.005"}, 0),
    "nice-19": ({}, 19),
    "omp-passive": ({ENV_VAR: "0.005", "OMP_WAIT_POLICY": "PASSIVE"}, 0),
}


def demo_batch(vocab: int, samples: int = 96, seed: int = 0) -> list[TokenSequence]:
    """Like a demo step: ~30-token prompts, 16-token completions."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(samples):
        prompt = int(torch.randint(24, 36, (1,), generator=g))
        ids = torch.randint(0, vocab, (prompt + 16,), generator=g).tolist()
        inf = [0.0] * prompt + (-torch.rand(16, generator=g) * 3).tolist()
        seqs.append(TokenSequence(ids, [0] * prompt + [1] * 16, inf, (i % 2) - 0.5))
    return seqs


class StepTimer:
    def __init__(self, model: str, run_dir: Path) -> None:
        cfg = TrainerConfig(
            run_dir=str(run_dir), model=ModelConfig(path=model), micro_batch_tokens=4096
        )
        self.trainer = Trainer(cfg, total_steps=0)
        self.seqs = demo_batch(self.trainer.tokenizer.vocab_size)
        self.loss = LossConfig(name="icepop").resolved
        self.norm = self.loss.normalizer(self.seqs)

    def step(self) -> float:
        t0 = time.perf_counter()
        self.trainer.train_step(self.seqs, self.loss, self.norm)
        return time.perf_counter() - t0


async def burst(server: ServerProcess, model: str, n: int = 96, tokens: int = 16) -> float:
    sampling = {"max_tokens": tokens, "temperature": 1.0, "ignore_eos": True}
    async with server.client() as client:
        t0 = time.perf_counter()
        await asyncio.gather(
            *(client.completion([5, 6, 7, i % 50 + 10], model, sampling) for i in range(n))
        )
        return time.perf_counter() - t0


def group_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a server and all its processes."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_round(name: str, server: ServerProcess, model: str, timer: StepTimer) -> dict[str, float]:
    """One `rlkit train`-like step: a burst of generations, then a timed trainer step."""
    gen_s = asyncio.run(burst(server, model))
    cpu0 = group_cpu_s(server.pid)
    step_s = timer.step()
    return {"gen_s": gen_s, "step_s": step_s, "server_cpu_s": group_cpu_s(server.pid) - cpu0}


def run_overlap(server: ServerProcess, model: str, timer: StepTimer) -> dict[str, float]:
    """A burst of 64-token generations with trainer steps beside it until the burst ends."""
    result: dict[str, float] = {}
    cpu0 = group_cpu_s(server.pid)
    thread = threading.Thread(
        target=lambda: result.update(gen_s=asyncio.run(burst(server, model, tokens=64)))
    )
    thread.start()
    steps = []
    while thread.is_alive():
        steps.append(timer.step())
    thread.join()
    return {
        "gen_s": result["gen_s"],
        "step_s": statistics.fmean(steps),
        "steps": len(steps),
        "server_cpu_s": group_cpu_s(server.pid) - cpu0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--overlap", action="store_true", help="generate and train at once")
    args = parser.parse_args()
    names = args.variants.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = str(init_tiny(root / "model", size=args.size))  # type: ignore[arg-type]
        timer = StepTimer(model, root / "run")
        servers = {
            n: start_server(model, log_path=root / f"{n}.log", env=VARIANTS[n][0]) for n in names
        }
        samples: dict[str, list[dict[str, float]]] = {n: [] for n in ["alone", *names]}
        try:
            for name, server in servers.items():
                server.wait_ready(timeout=900)
                if VARIANTS[name][1]:
                    os.setpriority(os.PRIO_PGRP, server.pid, VARIANTS[name][1])
                asyncio.run(burst(server, model, 8))  # warm-up
            timer.step()
            for i in range(args.steps):  # interleaved rounds: every variant sees the same load
                order = ["alone", *names]
                for name in order[i % len(order) :] + order[: i % len(order)]:
                    time.sleep(1.5)  # let every server's busy-wait from earlier rounds end
                    if name == "alone":
                        samples[name].append({"step_s": timer.step()})
                    elif args.overlap:
                        samples[name].append(run_overlap(servers[name], model, timer))
                    else:
                        samples[name].append(run_round(name, servers[name], model, timer))
        finally:
            for server in servers.values():
                server.stop()
    alone = statistics.median(s["step_s"] for s in samples["alone"])
    out: dict[str, object] = {
        "bench": "contention-overlap" if args.overlap else "contention",
        "size": args.size,
        "steps": args.steps,
        "alone_step_s": round(alone, 3),
    }
    for name in names:
        med = {k: statistics.median(s[k] for s in samples[name]) for k in samples[name][0]}
        med["ratio_to_alone"] = med["step_s"] / alone
        out[name] = {k: round(v, 3) for k, v in med.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
