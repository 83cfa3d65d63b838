"""The CPU demo (`scripts/demo.sh`) end to end: a baseline commit against this one, in one run.

    python tests/benchmarks/bench_demo.py --baseline REF [--new HEAD] [--args "..."] [--repeats N]

Each commit is checked out into a temporary git worktree whose `.venv` points at this
interpreter's venv and whose own code is put first on PYTHONPATH, then `SKIP_SETUP=1 bash
scripts/demo.sh` runs there (build the tiny model, SFT warm start, `rlkit train` with eval
before and after). Prints one JSON line: each commit's wall time, the RL phase's mean step
time and the trainer's mean wait for its batch (steps after the first), eval reward before
and after RL, the eval gain, the baseline/new ratios of wall and RL step time (means over
`--repeats` alternating runs), and the load average around each run (the machine may be
shared; the demos run one after the other).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout(ref: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref],
        check=True,
        capture_output=True,
    )
    (where / ".venv").symlink_to(sys.prefix)
    return where


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_demo(tree: Path, extra: list[str]) -> dict[str, float]:
    paths = [str(tree), str(tree / "cli"), *map(str, sorted((tree / "environments").glob("*/")))]
    shutil.rmtree(tree / "runs/demo", ignore_errors=True)  # a repeat starts afresh
    env = {**os.environ, "SKIP_SETUP": "1", "RUN": str(tree / "runs/demo")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(tree / "demo.log", "w") as log:
        subprocess.run(
            ["bash", "scripts/demo.sh", *extra],
            cwd=tree,
            env=env,
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wall = time.perf_counter() - t0
    evals = read_jsonl(tree / "runs/demo/rl/eval.jsonl")
    steps = sorted(e["step"] for e in evals)
    before = next(e for e in evals if e["step"] == steps[0])["reward_mean"]
    after = next(e for e in evals if e["step"] == steps[-1])["reward_mean"]
    rl = tree / "runs/demo/rl"
    steps_after_first = read_jsonl(rl / "metrics.jsonl")[1:]
    trainer_after_first = read_jsonl(rl / "trainer_metrics.jsonl")[1:]
    return {
        "wall_s": round(wall, 1),
        "rl_step_s": round(statistics.fmean(r["step_time_s"] for r in steps_after_first), 4),
        "trainer_batch_wait_s": round(
            statistics.fmean(r["batch_wait_s"] for r in trainer_after_first), 4
        ),
        "eval_before": round(before, 4),
        "eval_after": round(after, 4),
        "eval_gain": round(after - before, 4),
        "load_avg_start": load0,
        "load_avg_end": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", required=True, help="git ref of the baseline")
    parser.add_argument("--new", default="HEAD", help="git ref to compare (default HEAD)")
    parser.add_argument("--args", default="", help="extra arguments for `rlkit train`")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate baseline and new this many times"
    )
    args = parser.parse_args()
    extra = shlex.split(args.args)
    out: dict[str, object] = {"bench": "demo", "baseline": args.baseline, "new": args.new}
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {name: Path(tmp) / name for name in ("baseline", "new")}
        try:
            for name, ref in (("baseline", args.baseline), ("new", args.new)):
                checkout(ref, trees[name])
            for _ in range(args.repeats):
                for name in ("baseline", "new"):
                    runs[name].append(run_demo(trees[name], extra))
        finally:
            for tree in trees.values():
                if tree.exists():
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                        capture_output=True,
                    )
    for name, results in runs.items():
        out[name] = results[0] if len(results) == 1 else results
    mean = {
        name: {key: statistics.fmean(r[key] for r in results) for key in ("wall_s", "rl_step_s")}
        for name, results in runs.items()
    }
    out["speedup"] = round(mean["baseline"]["wall_s"] / mean["new"]["wall_s"], 2)
    out["rl_step_speedup"] = round(mean["baseline"]["rl_step_s"] / mean["new"]["rl_step_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
