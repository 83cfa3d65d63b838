"""Engine start time and generation throughput of the rlkit vLLM server, tiny vs small model,
and per way of running vLLM's engine and worker processes on CPU.

Run: python tests/benchmarks/bench_inference.py [--requests 32] [--max-tokens 128]
     [--start-methods uni,spawn,fork] [--sizes tiny,small]
Prints one JSON line: per start method and model size, seconds from launch to /health ready
and generated tokens/s for a batch of concurrent completions (ignore_eos, fixed length); the
tiny/small throughput ratio and each method's start and throughput against the first one's.
`uni` is rlkit's CPU default: the worker runs inside the engine process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`); `spawn` is vLLM's own CPU default, a worker process of
its own; `fork` forks both (`VLLM_WORKER_MULTIPROC_METHOD=fork`, opt-in). Methods alternate
per size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from rlkit.inference import ServerProcess, start_server
from rlkit.models import init_tiny

METHODS = {
    "uni": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
    "spawn": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
    "fork": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "fork"},
}


async def throughput(server: ServerProcess, model: str, requests: int, max_tokens: int) -> float:
    sampling = {"max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True}
    async with server.client() as client:
        await client.completion([5, 6, 7], model, {"max_tokens": 8})  # warm-up
        t0 = time.perf_counter()
        gens = await asyncio.gather(
            *(client.completion([5, 6, 7, i % 50 + 10], model, sampling) for i in range(requests))
        )
        elapsed = time.perf_counter() - t0
    return sum(len(g.completion_token_ids) for g in gens) / elapsed


def measure(model: str, log: Path, requests: int, max_tokens: int, method: str) -> dict[str, float]:
    env = {**os.environ, **METHODS[method]}
    t0 = time.perf_counter()
    server = start_server(model, log_path=log, env=env)
    try:
        server.wait_ready(timeout=900)
        start_s = time.perf_counter() - t0
        tps = asyncio.run(throughput(server, model, requests, max_tokens))
    finally:
        server.stop()
    return {"engine_start_s": round(start_s, 1), "gen_tokens_per_s": round(tps, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--start-methods", default="uni,spawn,fork")
    parser.add_argument("--sizes", default="tiny,small")
    args = parser.parse_args()
    methods = args.start_methods.split(",")
    sizes = args.sizes.split(",")
    results: dict[str, dict[str, dict[str, float]]] = {m: {} for m in methods}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            model = str(init_tiny(Path(tmp) / size, size=size))  # type: ignore[arg-type]
            for method in methods:
                log = Path(tmp) / f"{size}-{method}.log"
                results[method][size] = measure(model, log, args.requests, args.max_tokens, method)
                print(f"[bench] {size} {method}: {results[method][size]}", file=sys.stderr)
    out: dict = {"bench": "inference", "requests": args.requests, "max_tokens": args.max_tokens}
    out.update(results)
    if {"tiny", "small"} <= set(sizes):
        out["tokens_per_s_ratio_tiny_over_small"] = {
            m: round(r["tiny"]["gen_tokens_per_s"] / r["small"]["gen_tokens_per_s"], 2)
            for m, r in results.items()
        }
    first = methods[0]
    for method in methods[1:]:
        out[f"{method}_over_{first}"] = {
            size: {
                key: round(results[method][size][key] / results[first][size][key], 2)
                for key in ("engine_start_s", "gen_tokens_per_s")
            }
            for size in sizes
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
