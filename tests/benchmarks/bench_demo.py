"""The CPU demo (`scripts/demo.sh`) end to end: a baseline commit against this one, in one run.

    python tests/benchmarks/bench_demo.py --baseline REF [--new HEAD] [--args "..."]

Each commit is checked out into a temporary git worktree whose `.venv` points at this
interpreter's venv and whose own code is put first on PYTHONPATH, then `SKIP_SETUP=1 bash
scripts/demo.sh` runs there (build the tiny model, SFT warm start, `rlkit train` with eval
before and after). Prints one JSON line: each commit's wall time and eval reward before and
after RL, the eval gain, the baseline/new time ratio, and the load average around each run
(the machine may be shared; the two demos run one after the other).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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


def run_demo(tree: Path, extra: list[str]) -> dict[str, float]:
    paths = [str(tree), str(tree / "cli"), *map(str, sorted((tree / "environments").glob("*/")))]
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
    evals = [json.loads(x) for x in (tree / "runs/demo/rl/eval.jsonl").read_text().splitlines()]
    steps = sorted(e["step"] for e in evals)
    before = next(e for e in evals if e["step"] == steps[0])["reward_mean"]
    after = next(e for e in evals if e["step"] == steps[-1])["reward_mean"]
    return {
        "wall_s": round(wall, 1),
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
    args = parser.parse_args()
    extra = shlex.split(args.args)
    out: dict[str, object] = {"bench": "demo", "baseline": args.baseline, "new": args.new}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {name: Path(tmp) / name for name in ("baseline", "new")}
        try:
            for name, ref in (("baseline", args.baseline), ("new", args.new)):
                out[name] = run_demo(checkout(ref, trees[name]), extra)
        finally:
            for tree in trees.values():
                if tree.exists():
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                        capture_output=True,
                    )
    out["speedup"] = round(out["baseline"]["wall_s"] / out["new"]["wall_s"], 2)  # type: ignore[index]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
