"""LoRA against full-weight RL on the CPU demo workload, side by side in one run.

    python tests/benchmarks/bench_lora.py [--steps 60] [--rank 8] [--lora-lr 2e-3]

Builds the demo's tiny Qwen3 and its SFT warm start once (as `scripts/demo.sh` does), then runs
`rlkit train examples/tiny-cpu/train.toml` on it twice with the same steps and seed: full weights
(the demo's lr 5e-4) and `[model.lora]` (rank 8, alpha 16, a higher lr: on this workload
1e-2 and 2e-2 collapsed the reward, 5e-3 (40 steps) and 2e-3 (60 steps) raised it). Prints one
JSON line: for each variant the mean step time (steps after the first), the mean weight-update
time and bytes moved per update, the eval reward before and after RL and its gain; plus the
full/LoRA ratios of step time, update time and update bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RLKIT = str(Path(sys.executable).parent / "rlkit")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def warm_start(root: Path) -> Path:
    """The demo's base model and SFT warm start; returns the SFT model directory."""
    base = root / "base"
    subprocess.run([RLKIT, "model", "init-tiny", "--out", str(base), "--seed", "0"], check=True)
    data = root / "sft.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/tiny-cpu/make_sft_data.py"), str(data)], check=True
    )
    sft = ["--run_dir", str(root / "sft"), "--model.path", str(base), "--data.path", str(data)]
    subprocess.run([RLKIT, "sft", str(ROOT / "examples/tiny-cpu/sft.toml"), *sft], check=True)
    return root / "sft" / "final"


def run(model: Path, run_dir: Path, steps: int, extra: list[str]) -> dict[str, float]:
    cmd = [RLKIT, "train", str(ROOT / "examples/tiny-cpu/train.toml"), f"--model.path={model}"]
    cmd += [f"--log.run_dir={run_dir}", f"--orchestrator.max_steps={steps}", *extra]
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"rlkit train failed ({done.returncode}):\n{log.read_text()[-3000:]}")
    recs = read_jsonl(run_dir / "metrics.jsonl")[1:]
    evals = sorted(read_jsonl(run_dir / "eval.jsonl"), key=lambda e: e["step"])
    before, after = evals[0]["reward_mean"], evals[-1]["reward_mean"]
    return {
        "step_s": round(statistics.fmean(r["step_time_s"] for r in recs), 4),
        "update_s": round(statistics.fmean(r["weight_update_s"] for r in recs), 4),
        "update_bytes": int(statistics.fmean(r["weight_update_bytes"] for r in recs)),
        "eval_before": round(before, 4),
        "eval_after": round(after, 4),
        "eval_gain": round(after - before, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60, help="RL steps of each variant")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--lora-lr", type=float, default=2e-3, help="LoRA's learning rate")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = warm_start(root)
        full = run(model, root / "full", args.steps, [])
        lora = run(
            model,
            root / "lora",
            args.steps,
            [
                f"--model.lora.rank={args.rank}",
                f"--model.lora.alpha={2 * args.rank}",
                f"--trainer.optim.lr={args.lora_lr}",
            ],
        )
    out = {
        "bench": "lora",
        "steps": args.steps,
        "rank": args.rank,
        "lora_lr": args.lora_lr,
        "full": full,
        "lora": lora,
        "step_time_ratio_full_over_lora": round(full["step_s"] / lora["step_s"], 3),
        "update_time_ratio_full_over_lora": round(full["update_s"] / lora["update_s"], 2),
        "update_bytes_ratio_full_over_lora": round(full["update_bytes"] / lora["update_bytes"], 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
