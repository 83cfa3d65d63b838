"""The sandbox service (`rlkit sandbox serve`) vs today's in-process `rlkit.sandbox.run`.

One run, side by side, the same small program (sum of 1,000 numbers from stdin):
- latency p50, sequential: in-process (a fresh bubblewrap + interpreter per run), the service
  with no warm pool (`--pool-size 0`: every request a cold start) and with one (warm: requests
  spaced so the pool refills), and the program itself run in an already started interpreter
  (what a warm sandbox cannot avoid);
- where a warm request's time goes: the warm pool alone (the service's `ForkPool`: a ready
  sandbox taken and run in this process, no HTTP) and a bare authenticated HTTP round trip
  through rlkit's client (`GET /metrics`), both spaced like the warm requests: their sum is
  the floor a warm request is compared with (`warm_over_floor_ms`);
- executions/s at concurrency 1, 8 and 64 (in-process with its concurrency set to the same);
- a burst of 1,000 concurrent requests at a service with 8 slots and a 256-request queue:
  every one answered (result or 429), the service's memory before and after.
Prints one JSON line with the ratios.

    python tests/benchmarks/bench_sandbox_service.py [--runs 40] [--requests 96]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlkit import sandbox  # noqa: E402
from rlkit.sandbox import runner  # noqa: E402
from rlkit.sandbox.client import SandboxClient  # noqa: E402
from rlkit.sandbox.forkserver import ForkPool  # noqa: E402
from rlkit.sandbox.pool import Profile  # noqa: E402
from tests.helpers.sandbox_service import Service, sandbox_service  # noqa: E402

PROGRAM = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))"
STDIN = " ".join(str(i) for i in range(1000))
EXPECTED = "499500"


async def one() -> float:
    start = time.perf_counter()
    result = await sandbox.run(PROGRAM, stdin=STDIN)
    assert result.status == "ok" and result.stdout.strip() == EXPECTED, result
    return time.perf_counter() - start


async def sequential(runs: int, gap: float = 0.0) -> float:
    """p50 seconds of `runs` requests one after another (`gap` between them)."""
    times = []
    for _ in range(runs):
        times.append(await one())
        await asyncio.sleep(gap)
    return statistics.median(times)


async def throughput(requests: int, concurrency: int) -> float:
    limit = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with limit:
            await one()

    start = time.perf_counter()
    await asyncio.gather(*[limited() for _ in range(requests)])
    return requests / (time.perf_counter() - start)


async def pool_warm(runs: int, gap: float) -> float:
    """p50 seconds of a ready sandbox of a warm pool taken and run here: the service's work for
    a warm request without HTTP."""
    pool = ForkPool(Profile(timeout=30.0, memory_mb=1024), 1, runner.active_backend())
    pool.fill()
    times = []
    try:
        for _ in range(runs):
            while not pool.ready:
                await asyncio.sleep(0.01)
            await asyncio.sleep(gap)
            start = time.perf_counter()
            sandbox = await pool.take()
            assert sandbox is not None
            result = await sandbox.run(PROGRAM, "python", STDIN, {}, runner.limits(10.0, 512), 4096)
            times.append(time.perf_counter() - start)
            assert result.stdout.strip() == EXPECTED, result
            pool.fill()
    finally:
        await pool.close()
    return statistics.median(times)


async def http_round_trip(svc: Service, runs: int, gap: float) -> float:
    """p50 seconds of an authenticated `GET /metrics` through rlkit's client: what HTTP alone
    costs a request."""
    client = SandboxClient(svc.url, str(svc.token_file))
    times = []
    for _ in range(runs):
        await asyncio.sleep(gap)
        start = time.perf_counter()
        await client.call("GET", "/metrics", None, 1.0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def code_itself(runs: int) -> float:
    """p50 seconds of the program in an interpreter that is already running."""
    compiled = compile(PROGRAM.replace("sys.stdin.read()", "STDIN"), "<bench>", "exec")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        exec(compiled, {"STDIN": STDIN, "print": lambda *a: None})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def burst(svc: Service, count: int) -> dict:
    headers = {"Authorization": f"Bearer {svc.token}"}
    body = {"code": PROGRAM, "stdin": STDIN, "max_queue_s": 5.0}
    before = rss_mb(svc.proc.pid)
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=300) as client:

        async def post() -> int:
            try:
                return (await client.post(f"{svc.url}/run", json=body)).status_code
            except httpx.HTTPError:
                return -1

        codes = await asyncio.gather(*[post() for _ in range(count)])
    return {
        "sent": count,
        "ok": codes.count(200),
        "429": codes.count(429),
        "lost": count - codes.count(200) - codes.count(429),
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(rss_mb(svc.proc.pid), 1),
    }


def use(svc: Service | None) -> None:
    if svc is None:
        runner.configure(url="")
    else:
        runner.configure(url=svc.url, token_file=str(svc.token_file))


async def main(folder: Path, runs: int, requests: int) -> dict:
    levels = (1, 8, 64)
    out: dict = {"runs": runs, "requests_per_level": requests}
    await one()  # the sandbox's self-test and interpreter paths, once
    p50 = {"in_process": await sequential(runs)}
    rate: dict[str, dict[int, float]] = {"in_process": {}, "service": {}}
    for level in levels:
        runner.configure(concurrency=level)
        rate["in_process"][level] = await throughput(requests, level)
    with sandbox_service(folder / "cold", "--pool-size", "0") as cold:
        use(cold)
        await one()
        p50["service_cold"] = await sequential(runs)
        use(None)
    with sandbox_service(
        folder / "warm", "--pool-size", "16", "--concurrency", "64", "--queue", "1024"
    ) as warm:
        use(warm)
        await asyncio.sleep(3.0)  # the pool fills
        await one()
        p50["service_warm"] = await sequential(runs, gap=0.3)
        p50["http_round_trip"] = await http_round_trip(warm, runs, gap=0.3)
        for level in levels:
            rate["service"][level] = await throughput(requests, level)
        metrics = warm.metrics()
        use(None)
    with sandbox_service(folder / "burst", "--concurrency", "8", "--queue", "256") as svc:
        out["burst"] = await burst(svc, 1000)
    p50["pool_warm"] = await pool_warm(runs, gap=0.3)
    p50["code_itself"] = code_itself(runs)
    out["p50_ms"] = {k: round(v * 1000, 2) for k, v in p50.items()}
    out["warm_added_ms_over_code"] = round((p50["service_warm"] - p50["code_itself"]) * 1000, 2)
    out["pool_warm_added_ms_over_code"] = round((p50["pool_warm"] - p50["code_itself"]) * 1000, 2)
    # the floor: a bare authenticated round trip and the pool alone (the service's own pool)
    floor = p50["http_round_trip"] + p50["pool_warm"]
    out["warm_over_floor_ms"] = round((p50["service_warm"] - floor) * 1000, 2)
    out["cold_over_warm"] = round(p50["service_cold"] / p50["service_warm"], 2)
    out["in_process_over_warm"] = round(p50["in_process"] / p50["service_warm"], 2)
    out["executions_per_s"] = {
        path: {str(k): round(v, 1) for k, v in by_level.items()} for path, by_level in rate.items()
    }
    out["service_over_in_process"] = {
        str(k): round(rate["service"][k] / rate["in_process"][k], 2) for k in levels
    }
    pool = metrics["pools"][0]
    out["warm_service_pool"] = {k: pool[k] for k in ("warm_starts", "cold_starts", "size")}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--requests", type=int, default=96)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-service-") as folder:
        print(json.dumps(asyncio.run(main(Path(folder), args.runs, args.requests))))
