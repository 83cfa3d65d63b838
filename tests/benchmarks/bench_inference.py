"""Engine start time and generation throughput of the rlkit vLLM server, tiny vs small model.

Run: python tests/benchmarks/bench_inference.py [--requests 32] [--max-tokens 128]
Prints one JSON line: per model size, seconds from launch to /health ready, and generated
tokens/s for a batch of concurrent completions (ignore_eos, fixed length), plus the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from rlkit.inference import ServerProcess, start_server
from rlkit.models import init_tiny


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


def measure(size: str, root: Path, requests: int, max_tokens: int) -> dict[str, float]:
    model = str(init_tiny(root / size, size=size))  # type: ignore[arg-type]
    t0 = time.perf_counter()
    server = start_server(model, log_path=root / f"{size}.log")
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = measure("tiny", Path(tmp), args.requests, args.max_tokens)
        small = measure("small", Path(tmp), args.requests, args.max_tokens)
    print(
        json.dumps(
            {
                "bench": "inference",
                "requests": args.requests,
                "max_tokens": args.max_tokens,
                "tiny": tiny,
                "small": small,
                "tokens_per_s_ratio_tiny_over_small": round(
                    tiny["gen_tokens_per_s"] / small["gen_tokens_per_s"], 2
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
