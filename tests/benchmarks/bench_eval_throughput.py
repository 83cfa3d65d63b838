"""Eval throughput at concurrency 256 against a fixed-latency fake OpenAI server.

Ideal throughput is concurrency / latency requests per second. Three loops run interleaved
(best of `--repeats` each) against the same fake server in its own process, each timing
includes loading the environment (rlkit's loops each in a fresh process, imports untimed):
- `rlkit`: rlkit's eval loop (`rlkit.eval.run_eval`, what `rlkit eval` calls, writing
  results.jsonl as it goes) on rlkit's native reverse-text environment: the harness itself
  (issue goal: >= 0.9 of ideal);
- `base` (with `--base REF`): the same loop in the code of commit REF (extracted with `git
  archive`), interleaved with `rlkit`: whether a change cost throughput, on the same machine in
  the same minutes (`rlkit_over_base`);
- `bridge`: the same loop on a verifiers-style reverse-text `vf.SingleTurnEnv` (written once
  below) through rlkit's verifiers bridge (a worker in its own venv);
- `verifiers`: verifiers' own loop (`env.evaluate(...)` with an `AsyncOpenAI` client) on that
  environment, run by the bridge venv's python (rlkit's venv has no verifiers).
The fake server is by default its lean mode (plain asyncio HTTP, `--server lean`): FastAPI +
uvicorn's own per-request CPU would otherwise be most of what the benchmark measures on a shared
2-core machine; its CPU seconds are reported. Prints one JSON line with each loop's fraction of
the ideal, the ratios, and each loop's own CPU seconds (what machine load does not change: on a
shared 2-core machine the wall-clock fractions mostly measure the neighbours).

    .venv/bin/python tests/benchmarks/bench_eval_throughput.py [--requests 1024] [--latency 1.0]
        [--base REF]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.git_tree import extract  # noqa: E402

ENV_SOURCE = '''
"""Reverse-text in verifiers' classic API (shape of the 2025 `reverse_text` environment)."""

import difflib

import verifiers as vf
from datasets import Dataset


def lcs_ratio(completion, answer) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return difflib.SequenceMatcher(None, text, answer).ratio()


def load_environment(num_examples: int = 256) -> vf.SingleTurnEnv:
    texts = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(num_examples)]
    dataset = Dataset.from_list([{"question": t, "answer": t[::-1]} for t in texts])
    return vf.SingleTurnEnv(
        dataset=dataset,
        system_prompt="Reverse the text character by character.",
        parser=vf.Parser(),
        rubric=vf.Rubric(funcs=[lcs_ratio], weights=[1.0]),
    )
'''


VERIFIERS = "0.1.3.post0"  # the era this environment's API is written in
PYPROJECT = f"""[project]
name = "bench-reverse-text"
version = "0.1.0"
dependencies = ["verifiers=={VERIFIERS}", "datasets>=3.0"]
"""


def start_fake_server(latency: float, lean: bool = True) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "tests.helpers.fake_openai", "--latency", str(latency)]
    proc = subprocess.Popen(
        [*cmd, "--lean"] if lean else cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    deadline = time.monotonic() + 30
    import httpx

    while time.monotonic() < deadline:
        try:
            if httpx.get(url.removesuffix("/v1") + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fake server did not start")


RLKIT_LOOP = """
import json, sys, time
from pathlib import Path
from rlkit.eval import EvalConfig, load_run, run_eval
env_id, env_args, url, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
n, r, concurrency = map(int, sys.argv[5:])
config = EvalConfig(
    env_id=env_id, env_args=env_args, model="fake-model", base_url=url, num_examples=n,
    rollouts_per_example=r, max_concurrent=concurrency, output_dir=Path(out),
)
t0, cpu0 = time.perf_counter(), time.process_time()
run_dir = run_eval(config)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
run = load_run(run_dir)
assert len(run.results) == n * r and run.metadata.summary["errors"] == 0
print(json.dumps([elapsed, cpu]))
"""


def bench_rlkit(
    tree: Path, env_id: str, env_args: dict, url: str, n: int, r: int, concurrency: int, out: Path
) -> tuple[float, float]:
    """rlkit's eval loop with the code of `tree` (this checkout, or `--base`'s) in a process of
    its own, its imports before the clock starts."""
    args = [env_id, json.dumps(env_args), url, str(out), str(n), str(r), str(concurrency)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "cli")])}
    done = subprocess.run(
        [sys.executable, "-c", RLKIT_LOOP, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=True,
    )
    elapsed, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return elapsed, cpu


VERIFIERS_LOOP = """
import json, sys, time
t0, cpu0 = time.perf_counter(), time.process_time()  # like rlkit's: includes loading
from bench_reverse_text import load_environment
from openai import AsyncOpenAI
url, n, r, concurrency = sys.argv[1], *map(int, sys.argv[2:])
env = load_environment(num_examples=n)
client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=5, timeout=600)
results = env.evaluate(
    client, "fake-model", num_examples=n, rollouts_per_example=r, max_concurrent=concurrency
)
assert len(results.reward) == n * r
print(json.dumps([time.perf_counter() - t0, time.process_time() - cpu0]))
"""


def bench_verifiers(
    python: Path, env_dir: Path, url: str, n: int, r: int, concurrency: int
) -> tuple[float, float]:
    """verifiers' own loop, in the bridge venv (its imports warmed by an earlier run)."""
    args = [str(python), "-c", VERIFIERS_LOOP, url, str(n), str(r), str(concurrency)]
    env = {**os.environ, "PYTHONPATH": str(env_dir)}
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    elapsed, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--rollouts-per-example", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--base", default="", help="git ref whose rlkit loop runs beside this one")
    parser.add_argument(
        "--server",
        choices=["lean", "fastapi"],
        default="lean",
        help="fake server: plain asyncio HTTP (default) or the FastAPI/uvicorn test double",
    )
    args = parser.parse_args()
    r = args.rollouts_per_example
    n = args.requests // r
    ideal = args.concurrency / args.latency
    report: dict[str, object] = {
        "bench": "eval_throughput",
        "requests": n * r,
        "concurrency": args.concurrency,
        "latency_s": args.latency,
        "ideal_rps": ideal,
    }

    from rlkit.envs.bridge.venvs import ensure_venv

    report["verifiers_version"] = VERIFIERS
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = Path(tmp) / "envs" / "bench-reverse-text"
        env_dir.mkdir(parents=True)
        (env_dir / "bench_reverse_text.py").write_text(textwrap.dedent(ENV_SOURCE))
        # a verifiers package: rlkit runs it through its bridge (a worker in its own venv)
        (env_dir / "pyproject.toml").write_text(PYPROJECT)
        os.environ["RLKIT_ENV_PATH"] = str(Path(tmp) / "envs")
        vf_python = ensure_venv("bench-reverse-text", VERIFIERS, ["datasets>=3.0"])
        trees = {"rlkit": ROOT, "bridge": ROOT}
        if args.base:
            trees["base"] = extract(args.base, Path(tmp) / "base")

        proc, url = start_fake_server(args.latency, lean=args.server == "lean")
        server = psutil.Process(proc.pid)
        server_cpu: list[float] = []
        native = ("reverse-text", {"num_eval_examples": n})
        loops = {"rlkit": native, "bridge": ("bench-reverse-text", {"num_examples": n})}
        if args.base:
            loops["base"] = native
        rps: dict[str, list[float]] = {name: [] for name in [*loops, "verifiers"]}
        cpu: dict[str, list[float]] = {name: [] for name in [*loops, "verifiers"]}
        try:
            bench_verifiers(vf_python, env_dir, url, 8, 1, 8)  # warm the venv's imports
            for repeat in range(args.repeats):  # interleaved, best of each: the machine is shared
                for name, (env_id, env_args) in loops.items():
                    before = sum(server.cpu_times()[:2])
                    out = Path(tmp) / f"{name}{repeat}"
                    elapsed, cpu_s = bench_rlkit(
                        trees[name], env_id, env_args, url, n, r, args.concurrency, out
                    )
                    if name == "rlkit":
                        server_cpu.append(sum(server.cpu_times()[:2]) - before)
                    rps[name].append(n * r / elapsed)
                    cpu[name].append(cpu_s)
                elapsed, cpu_s = bench_verifiers(vf_python, env_dir, url, n, r, args.concurrency)
                rps["verifiers"].append(n * r / elapsed)
                cpu["verifiers"].append(cpu_s)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    best = {name: max(runs) for name, runs in rps.items()}
    for name, value in best.items():
        report[f"{name}_rps"] = value
        report[f"{name}_fraction_of_ideal"] = value / ideal
    report["ratio_rlkit_over_verifiers"] = best["rlkit"] / best["verifiers"]
    report["ratio_bridge_over_verifiers"] = best["bridge"] / best["verifiers"]
    if args.base:
        report["base"] = args.base
        report["rlkit_over_base"] = best["rlkit"] / best["base"]
    report["runs_rps"] = rps
    # The client's own CPU cost, which machine load does not change: CPU seconds per run and
    # the share of one core the client needs to keep up with the ideal rate (the bridge
    # worker's CPU is not counted in `bridge`).
    for name, runs in cpu.items():
        report[f"{name}_client_cpu_s"] = min(runs)
        report[f"{name}_client_core_share_at_ideal"] = min(runs) / (n * r / ideal)
    # The fake server's own CPU per run (during rlkit's runs): what it takes from the client.
    report["server"] = args.server
    report["server_cpu_s"] = min(server_cpu)
    report["server_core_share_at_ideal"] = min(server_cpu) / (n * r / ideal)
    report["load_avg"] = os.getloadavg()[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
