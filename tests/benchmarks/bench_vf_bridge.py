"""Rollouts/s through the verifiers bridge vs rlkit-native reverse-text (fake server, c=64).

Both environments reverse text in one model turn and are scored by their own rubric:
`reverse-text` (rlkit-native, in process) and `vf-reverse-text` (verifiers 0.1.3, run by a bridge
worker in its own venv). The fake OpenAI server runs in its own process with a fixed latency,
so ideal throughput is concurrency / latency. Environments are loaded first (the bridge's
worker start is reported apart); then each runs `--rollouts` rollouts (groups of 4) with at most
`--concurrency` in flight, alternating, best of `--repeats`. Prints one JSON line with each
variant's rollouts/s, CPU seconds per 100 rollouts (rlkit's process, plus the worker's for the
bridge) and the ratio bridge / native (goal: >= 0.8).

    .venv/bin/python tests/benchmarks/bench_vf_bridge.py [--rollouts 1024] [--latency 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from bench_eval_throughput import start_fake_server

REPO = Path(__file__).resolve().parents[2]
GROUP = 4


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(env, url: str, rollouts: int, concurrency: int) -> tuple[float, float]:
    """(wall seconds, rlkit-process CPU seconds) for `rollouts` rollouts; none may error."""
    from rlkit.inference import InferenceClient

    rows = list(env.get_eval_dataset())
    semaphore = asyncio.Semaphore(concurrency // GROUP)
    results: list = []

    async def group(i: int) -> None:
        async with semaphore:
            results.extend(
                await env.run_group(
                    rows[i % len(rows)], client, "fake-model", {"max_tokens": 64}, GROUP
                )
            )

    async with InferenceClient(url, max_connections=concurrency) as client:
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(group(i) for i in range(rollouts // GROUP)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    errors = [r.error for r in results if r.error]
    assert not errors and len(results) == rollouts, errors[:3]
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RLKIT_ENV_PATH", str(REPO / "environments"))
    from rlkit.envs import load_environment

    proc, url = start_fake_server(args.latency, lean=False)
    try:
        native = load_environment("reverse-text", num_eval_examples=64)
        t0 = time.perf_counter()
        bridged = load_environment("vf-reverse-text", num_eval_examples=64)
        bridge_load_s = time.perf_counter() - t0
        worker_pid = bridged.worker.proc.pid
        best: dict[str, float] = {"native": 0.0, "bridge": 0.0}
        cpu: dict[str, float] = {"native": float("inf"), "bridge": float("inf")}
        for _ in range(args.repeats):
            for name, env in (("native", native), ("bridge", bridged)):
                worker_cpu0 = cpu_seconds(worker_pid)
                elapsed, own_cpu = asyncio.run(run(env, url, args.rollouts, args.concurrency))
                worker_cpu = cpu_seconds(worker_pid) - worker_cpu0 if name == "bridge" else 0.0
                best[name] = max(best[name], args.rollouts / elapsed)
                cpu[name] = min(cpu[name], 100 * (own_cpu + worker_cpu) / args.rollouts)
        bridged.close()
    finally:
        proc.kill()
    ideal = args.concurrency / args.latency
    print(
        json.dumps(
            {
                "bench": "vf_bridge",
                "rollouts": args.rollouts,
                "concurrency": args.concurrency,
                "latency_s": args.latency,
                "ideal_rollouts_per_s": ideal,
                "native_rollouts_per_s": round(best["native"], 1),
                "bridge_rollouts_per_s": round(best["bridge"], 1),
                "ratio_bridge_over_native": round(best["bridge"] / best["native"], 3),
                "cpu_s_per_100_rollouts": {k: round(v, 3) for k, v in cpu.items()},
                "bridge_worker_start_s": round(bridge_load_s, 1),
                "verifiers_version": bridged.verifiers_version,
                "load_average": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
