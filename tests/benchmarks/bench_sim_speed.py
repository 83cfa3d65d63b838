"""The simulator's own speed, old code against new in one run: CPU seconds of one big c3po run.

Each round runs `bench_sim_scale.py --parts cost` (one C3PO++ run of `--cost servers,steps,
groups`) in a copy of the code at `--base` (a git ref, extracted with `git archive`) and in
this checkout, interleaved, each in its own process so neither inherits the other's heap. The
simulated result must not change (the same simulated hours to the bit: a speed-up that changes
what is simulated is a bug), so the line also says whether they agree.

    python tests/benchmarks/bench_sim_speed.py [--base REF] [--cost 256,200,32] [--rounds 2]

Prints one JSON line: CPU seconds per variant and round, and base / new (the speed-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.git_tree import extract  # noqa: E402


def cost(tree: Path, spec: str, out: Path) -> dict[str, Any]:
    """One `--parts cost` run with `tree`'s code first on the path."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'cli'}"}
    script = tree / "tests" / "benchmarks" / "bench_sim_scale.py"
    done = subprocess.run(
        [sys.executable, str(script), "--parts", "cost", "--cost", spec, "--out", str(out)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["cost"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", default="7773f51", help="git ref of the old code")
    p.add_argument("--new", default="", help="git ref of the new code (default: this checkout)")
    p.add_argument("--cost", default="256,200,32", help="servers,steps,groups of 8 per step")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = extract(args.base, Path(tmp) / "base")
        new = extract(args.new, Path(tmp) / "new") if args.new else ROOT
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
        for _ in range(args.rounds):
            for name, tree in (("base", base), ("new", new)):
                runs[name].append(cost(tree, args.cost, Path(tmp) / f"out-{name}"))
    cpu = {name: [r["cpu_s"] for r in rows] for name, rows in runs.items()}
    hours = {name: {r["simulated_hours"] for r in rows} for name, rows in runs.items()}
    print(
        json.dumps(
            {
                "benchmark": "sim_speed_base_vs_new",
                "base": args.base,
                "new": args.new or "checkout",
                "cost": args.cost,
                "cpu_s": cpu,
                "cpu_us_per_trained_rollout": {
                    name: [round(r["cpu_us_per_trained_rollout"], 1) for r in rows]
                    for name, rows in runs.items()
                },
                "speedup": statistics.median(cpu["base"]) / statistics.median(cpu["new"]),
                "same_simulated_result": hours["base"] == hours["new"] and len(hours["new"]) == 1,
            }
        )
    )


if __name__ == "__main__":
    main()
