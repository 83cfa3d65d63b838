"""LoRA against full-weight RL on the CPU demo workload: a short learning-rate sweep of each.

    python tests/benchmarks/bench_lora.py [--size small] [--steps 60] [--rank 16]
        [--full-lrs 2e-4,5e-4,1e-3] [--lora-lrs 2e-3,5e-3,1e-2] [--sft-steps N] [--sft-lr LR]
        [--eval-examples N] [--seeds 0,1] [--work DIR]

Builds the demo's Qwen3 at `--size` (`rlkit model init-tiny --size`) and its SFT warm start once (as
`scripts/demo.sh` does; `--sft-steps` and `--sft-lr` override sft.toml's max_steps and lr), then
runs `rlkit train examples/tiny-cpu/train.toml` on it once per variant, learning rate and seed
(`--seeds`: the trainer's and the orchestrator's), all with the same steps and the eval on
`--eval-examples` prompts (4 samples each; the demo's 64 by default): full weights at each of
`--full-lrs`, `[model.lora]` (rank `--rank`, alpha 2 x rank, the default targets: every attention
and MLP projection, i.e. every linear layer but the output head) at each of `--lora-lrs`. The
"LoRA without regret" claim is that LoRA on all linear layers matches full RL fine-tuning at about
10x the learning rate.

Prints one progress line per run to stderr and one JSON line to stdout: each run's wall time,
mean step time (steps after the first), mean weight-update time and bytes moved per update,
eval reward before and after RL and its gain, and each learning rate's gain averaged over the
seeds; per variant the best learning rate (largest mean gain) and that gain;
`lora_gain_over_full` = best LoRA gain / best full gain (null unless full weights gained more
than the eval's noise, `eval_noise`); and the full/LoRA ratios of step time, update time and
update bytes of the two best learning rates' first-seed runs. `--work DIR` keeps every run
directory (metrics.jsonl, eval.jsonl, logs) under DIR and reuses the warm start and any finished
run already there (so a sweep can be run in parts; a repeat needs a fresh DIR).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RLKIT = str(Path(sys.executable).parent / "rlkit")
# The eval reward of one model moves by about this much between identical runs (the before-RL
# evals of one warm start: 0.43-0.45 on tiny, 0.252-0.264 on small); a ratio over a full-weight
# gain no larger than that says nothing, so lora_gain_over_full is null then.
EVAL_NOISE = 0.02
EVAL_NOISE_EXAMPLES = 64  # the eval size EVAL_NOISE was read at


def eval_noise(examples: int) -> float:
    """The eval's noise at `examples` prompts: a mean's spread shrinks as 1/sqrt(samples)."""
    return EVAL_NOISE * math.sqrt(EVAL_NOISE_EXAMPLES / examples)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def lrs(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def warm_start(root: Path, size: str, sft_steps: int | None, sft_lr: float | None) -> Path:
    """The demo's base model at `size` and its SFT warm start; returns the SFT model directory."""
    final = root / "sft" / "final"
    if final.is_dir():
        return final
    base = root / "base"
    init = [RLKIT, "model", "init-tiny", "--out", str(base), "--seed", "0", "--size", size]
    subprocess.run(init, check=True)
    data = root / "sft.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/tiny-cpu/make_sft_data.py"), str(data)], check=True
    )
    sft = ["--run_dir", str(root / "sft"), "--model.path", str(base), "--data.path", str(data)]
    if sft_steps is not None:
        sft += ["--max_steps", str(sft_steps)]
    if sft_lr is not None:
        sft += ["--optim.lr", str(sft_lr)]
    subprocess.run([RLKIT, "sft", str(ROOT / "examples/tiny-cpu/sft.toml"), *sft], check=True)
    return final


def run(model: Path, run_dir: Path, steps: int, extra: list[str]) -> dict[str, float]:
    """One `rlkit train` run; its result is kept beside run_dir and reused if already there."""
    result = run_dir.parent / f"{run_dir.name}.json"
    if result.exists():
        return json.loads(result.read_text())
    cmd = [RLKIT, "train", str(ROOT / "examples/tiny-cpu/train.toml"), f"--model.path={model}"]
    cmd += [f"--log.run_dir={run_dir}", f"--orchestrator.max_steps={steps}", *extra]
    log = run_dir.parent / f"{run_dir.name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"rlkit train failed ({done.returncode}):\n{log.read_text()[-3000:]}")
    recs = read_jsonl(run_dir / "metrics.jsonl")[1:]
    evals = sorted(read_jsonl(run_dir / "eval.jsonl"), key=lambda e: e["step"])
    before, after = evals[0]["reward_mean"], evals[-1]["reward_mean"]
    res = {
        "wall_s": round(time.monotonic() - start, 1),
        "step_s": round(statistics.fmean(r["step_time_s"] for r in recs), 4),
        "update_s": round(statistics.fmean(r["weight_update_s"] for r in recs), 4),
        "update_bytes": int(statistics.fmean(r["weight_update_bytes"] for r in recs)),
        "eval_before": round(before, 4),
        "eval_after": round(after, 4),
        "eval_gain": round(after - before, 4),
    }
    result.write_text(json.dumps(res))
    return res


def sweep(args: argparse.Namespace, root: Path) -> dict:
    model = warm_start(root, args.size, args.sft_steps, args.sft_lr)
    lora = [f"--model.lora.rank={args.rank}", f"--model.lora.alpha={2 * args.rank}"]
    variants = {"full": (lrs(args.full_lrs), []), "lora": (lrs(args.lora_lrs), lora)}
    evals = [f"--env.0.args.num_eval_examples={args.eval_examples}"]
    evals.append(f"--orchestrator.eval.examples={args.eval_examples}")
    seeds = [int(x) for x in args.seeds.split(",")]
    runs: dict[str, dict[str, dict]] = {}
    gains: dict[str, dict[str, float]] = {}
    for name, (rates, extra) in variants.items():
        runs[name], gains[name] = {}, {}
        for lr in rates:
            for seed in seeds:
                opts = [*extra, *evals, f"--trainer.optim.lr={lr}", f"--trainer.seed={seed}"]
                run_dir = root / f"{name}-lr{lr:g}-seed{seed}"
                res = run(model, run_dir, args.steps, [*opts, f"--orchestrator.seed={seed}"])
                runs[name][f"{lr:g}/seed{seed}"] = res
                print(f"[bench_lora] {run_dir.name}: {res}", file=sys.stderr, flush=True)
            mean = statistics.fmean(runs[name][f"{lr:g}/seed{s}"]["eval_gain"] for s in seeds)
            gains[name][f"{lr:g}"] = round(mean, 4)
    best = {name: max(by_lr, key=lambda lr: by_lr[lr]) for name, by_lr in gains.items()}
    first = {name: runs[name][f"{best[name]}/seed{seeds[0]}"] for name in runs}
    full, lora_best = first["full"], first["lora"]
    full_gain, lora_gain = gains["full"][best["full"]], gains["lora"][best["lora"]]
    noise = eval_noise(args.eval_examples)
    return {
        "bench": "lora",
        "size": args.size,
        "steps": args.steps,
        "rank": args.rank,
        "alpha": 2 * args.rank,
        "eval_examples": args.eval_examples,
        "seeds": seeds,
        "runs": runs,
        "mean_gain": gains,
        "best_lr": best,
        "best_gain": {"full": full_gain, "lora": lora_gain},
        "eval_noise": round(noise, 4),
        "lora_gain_over_full": round(lora_gain / full_gain, 3) if full_gain > noise else None,
        "step_time_ratio_full_over_lora": round(full["step_s"] / lora_best["step_s"], 3),
        "update_time_ratio_full_over_lora": round(full["update_s"] / lora_best["update_s"], 2),
        "update_bytes_ratio_full_over_lora": round(
            full["update_bytes"] / lora_best["update_bytes"], 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", choices=["tiny", "small"], default="tiny", help="model shape")
    parser.add_argument("--steps", type=int, default=60, help="RL steps of every run")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--full-lrs", default="5e-4", help="full weights' learning rates, a,b,c")
    parser.add_argument("--lora-lrs", default="5e-3", help="LoRA's learning rates, a,b,c")
    parser.add_argument("--sft-steps", type=int, help="override sft.toml's max_steps")
    parser.add_argument("--sft-lr", type=float, help="override sft.toml's optim.lr")
    parser.add_argument("--eval-examples", type=int, default=64, help="eval prompts (x 4 samples)")
    parser.add_argument("--seeds", default="0", help="seeds of every variant and lr, a,b")
    parser.add_argument("--work", type=Path, help="keep run directories here (default: a temp dir)")
    args = parser.parse_args()
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        out = sweep(args, args.work)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = sweep(args, Path(tmp))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
