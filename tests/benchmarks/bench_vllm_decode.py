"""The real vLLM CPU server's decode step and weight update against the sequences running: the
simulator's engine model (`tick_base_s + tick_per_seq_s * running`, `update_s +
update_per_seq_s * running`) measured rather than fitted to a result.

The tiny model bench_scheduler.py serves (qwen3 tiny, seed 0, 4-token prompts, `ignore_eos`,
lengths forced with `min_tokens` = `max_tokens`): at each concurrency c, c requests of
`--short` and then of `--long` tokens start together; the decode step at c is the difference
of the two wall times over the difference of the lengths (the request's fixed costs, HTTP and
prefill, cancel out). A least-squares line through the steps gives the two parameters. The
weight update (`/rlkit/update_weights` reloading the served checkpoint, as bench_scheduler
does) is timed with 0 and with c requests of `--long` tokens in flight, another line. The
workload is not bench_scheduler's (fixed lengths, no scheduler, no weight updates), so
validating the simulator on bench_scheduler's workload with these figures fits nothing to it.

    python tests/benchmarks/bench_vllm_decode.py [--concurrency 1,8,32,64,128] [--rounds 2]

Prints one JSON line: the step and the update per concurrency (medians over rounds) and the
fitted lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


async def burst(client: Any, model: str, n: int, tokens: int) -> float:
    """Wall seconds for `n` requests of exactly `tokens` tokens started together."""
    params = {"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 1.0}
    t0 = time.perf_counter()
    await asyncio.gather(*(client.completion([5, 6, 7, 8], model, params) for _ in range(n)))
    return time.perf_counter() - t0


async def update(client: Any, admin: Any, model: str, n: int, tokens: int) -> float:
    """Seconds of one weight update with `n` requests of `tokens` tokens decoding."""
    params = {"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 1.0}
    running = [
        asyncio.create_task(client.completion([5, 6, 7, 8], model, params)) for _ in range(n)
    ]
    await asyncio.sleep(0.3 if n else 0.0)  # admitted and decoding
    t0 = time.perf_counter()
    await admin.update_weights(model)
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*running)
    return elapsed


def line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


async def measure(server: Any, model: str, args: argparse.Namespace) -> dict[str, Any]:
    from rlkit.inference.admin import AdminClient

    client = server.client()
    admin = AdminClient(client)
    try:
        await burst(client, model, max(args.concurrency), args.short)  # warm up, untimed
        steps: dict[int, list[float]] = {c: [] for c in args.concurrency}
        for _ in range(args.rounds):
            for c in args.concurrency:
                short = await burst(client, model, c, args.short)
                long = await burst(client, model, c, args.long)
                steps[c].append((long - short) / (args.long - args.short))
        in_flight = [0, *args.concurrency[-2:]]
        updates: dict[int, list[float]] = {c: [] for c in in_flight}
        for _ in range(args.rounds):
            for c in in_flight:
                updates[c].append(await update(client, admin, model, c, args.long))
    finally:
        await client.aclose()
    xs = list(args.concurrency)
    ys = [statistics.median(steps[c]) for c in xs]
    tick_base, tick_per_seq = line(xs, ys)
    update_ys = [statistics.median(updates[c]) for c in in_flight]
    update_base, update_per_seq = line(in_flight, update_ys)
    return {
        "benchmark": "vllm_cpu_decode_step",
        "lengths": [args.short, args.long],
        "step_s": {str(c): ys[i] for i, c in enumerate(xs)},
        "step_s_rounds": {str(c): v for c, v in steps.items()},
        "tick_base_s": tick_base,
        "tick_per_seq_s": tick_per_seq,
        "update_s": {str(c): update_ys[i] for i, c in enumerate(in_flight)},
        "update_s_rounds": {str(c): v for c, v in updates.items()},
        "update_base_s": update_base,
        "update_per_seq_s": update_per_seq,
        "load_avg": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", default="1,8,32,64,128")
    p.add_argument("--short", type=int, default=32)
    p.add_argument("--long", type=int, default=160)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]

    from rlkit.inference import start_server
    from rlkit.models import init_tiny
    from rlkit.protocol.credentials import TOKEN_FILE_ENV, ensure_token_file
    from tests.helpers.published import publish_files

    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-decode-"))
    # one credential for the server and the version record it loads (a record signed
    # with another token is refused: 403 on /rlkit/update_weights)
    token_file = tmp / "token"
    ensure_token_file(token_file)
    os.environ[TOKEN_FILE_ENV] = str(token_file)
    model_dir = publish_files(init_tiny(tmp / "model", arch="qwen3", size="tiny", seed=0))
    server = start_server(
        str(model_dir),
        log_path=tmp / "vllm.log",
        extra_args=["--max-num-seqs", str(max(args.concurrency))],
        weights_roots=[tmp],
    )
    try:
        server.wait_ready(600)
        print(json.dumps(asyncio.run(measure(server, str(model_dir), args))))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
