"""Sandbox overhead per execution vs a bare subprocess, and sandboxed executions/s.

Runs the same small Python program N times with `rlkit.sandbox.run` (bubblewrap + prlimit) and
as a bare `python3` subprocess (same interpreter, same pipes), then measures throughput of the
sandbox at concurrency 2 and 8. Also times grading one 15-test function problem both ways the
code environment could: one sandboxed process per test, and its choice, one sandbox run whose
harness forks a child per test (`code_env.grading.run_tests`). Prints one JSON line.

    .venv/bin/python tests/benchmarks/bench_sandbox.py [--runs 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time

from code_env.grading import TestCase, TestSuite, run_tests

from rlkit import sandbox
from rlkit.sandbox.launch import sandbox_python

PROGRAM = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))"
STDIN = " ".join(str(i) for i in range(1000))


async def bare_run() -> float:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        str(sandbox_python()),
        "-B",
        "-c",
        PROGRAM,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate(STDIN.encode())
    assert proc.returncode == 0 and out.strip() == b"499500"
    return time.perf_counter() - start


async def sandbox_run() -> float:
    start = time.perf_counter()
    result = await sandbox.run(PROGRAM, stdin=STDIN)
    assert result.status == "ok" and result.stdout.strip() == "499500", result
    return time.perf_counter() - start


GCD = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
CASES = [[a, b] for a, b in zip(range(12, 27), range(18, 33), strict=True)]


async def grade_per_test() -> float:
    start = time.perf_counter()
    code = GCD + "import json, sys\nprint(json.dumps(gcd(*json.loads(sys.stdin.read()))))"
    results = await asyncio.gather(*(sandbox.run(code, stdin=json.dumps(c)) for c in CASES))
    assert all(r.status == "ok" for r in results)
    return time.perf_counter() - start


async def grade_with_harness() -> float:
    suite = TestSuite(
        style="function",
        fn_name="gcd",
        cases=[TestCase(input=c, output=math.gcd(*c)) for c in CASES],
    )
    start = time.perf_counter()
    assert all(await run_tests(GCD, suite))
    return time.perf_counter() - start


def quantiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=20)
    return statistics.median(samples), cuts[18]


async def throughput(concurrency: int, total: int) -> float:
    sandbox.configure(concurrency=concurrency)
    start = time.perf_counter()
    await asyncio.gather(*(sandbox_run() for _ in range(total)))
    return total / (time.perf_counter() - start)


async def main(runs: int) -> None:
    backend = sandbox.active_backend().name
    await sandbox_run()  # warm caches (self-test, page cache) before timing
    bare, boxed = [], []
    for _ in range(runs):  # interleaved so machine noise hits both alike
        bare.append(await bare_run())
        boxed.append(await sandbox_run())
    bare_p50, bare_p95 = quantiles(bare)
    box_p50, box_p95 = quantiles(boxed)
    result = {
        "bench": "sandbox",
        "backend": backend,
        "runs": runs,
        "bare_p50_ms": round(bare_p50 * 1e3, 2),
        "bare_p95_ms": round(bare_p95 * 1e3, 2),
        "sandbox_p50_ms": round(box_p50 * 1e3, 2),
        "sandbox_p95_ms": round(box_p95 * 1e3, 2),
        "overhead_p50_ms": round((box_p50 - bare_p50) * 1e3, 2),
        "overhead_p95_ms": round((box_p95 - bare_p95) * 1e3, 2),
        "ratio_p50": round(box_p50 / bare_p50, 3),
        "exec_per_s_c2": round(await throughput(2, 4 * runs), 1),
        "exec_per_s_c8": round(await throughput(8, 4 * runs), 1),
    }
    sandbox.configure(concurrency=len(os.sched_getaffinity(0)))
    per_test = statistics.median([await grade_per_test() for _ in range(5)])
    harness = statistics.median([await grade_with_harness() for _ in range(5)])
    result["grade_15_tests_process_per_test_ms"] = round(per_test * 1e3, 1)
    result["grade_15_tests_fork_harness_ms"] = round(harness * 1e3, 1)
    result["grade_ratio"] = round(per_test / harness, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    asyncio.run(main(parser.parse_args().runs))
