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

    python tests/benchmarks/bench_lora.py --update-size qwen3-0.6b [--rank 16] [--repeats 5]

An adapter's update at a real model's shapes (issue 63 item 5), instead of the sweep: a rank
`--rank` adapter on every default target of a random base at `--update-size`
(`rlkit.models.shapes`; bf16, as the trainer exports it) is published as the trainer does
(`write_adapter` into a directory built under a temporary name, renamed, marked published:
`export_s`) and loaded by one vLLM CPU server with LoRA on (`/rlkit/load_adapter`, vLLM's
in-place adapter load: `load_s`), alternating two adapters `--repeats` times after a warm-up.
Against: `raw_copy_s`, the adapter's tensors copied into preallocated ones (on one torch
thread: on a loaded 2-core machine two spinning OpenMP threads made it 3-10x slower). The
load's HTTP round trip is estimated by `/rlkit/status` (`http_s`) and rlkit's own check of the
directory (`check_adapter_dir`) timed in-process (`check_s`), so vLLM's own load is about
`load_s - http_s - check_s` (`vllm_load_s`) and rlkit's part of an update is the rest
(`rlkit_s` = update - vllm_load). Prints one JSON line with the medians and
`update_over_raw_copy_plus_vllm` = update / (raw copy + vLLM's load) and
`rlkit_over_raw_copy` = rlkit_s / raw copy.
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


def adapter_tensors(size: str, rank: int, seed: int) -> dict[str, object]:
    """A rank-`rank` adapter's tensors (PEFT's saved names, bf16) on every default LoRA target
    of a dense Qwen3 at `size`'s real shapes; B nonzero, as after training."""
    import torch

    from rlkit.models.shapes import REAL_SHAPES
    from rlkit.protocol.model import LORA_TARGETS
    from rlkit.trainer.lora import PEFT_PREFIX

    c = REAL_SHAPES[size]
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    dims = {  # (in, out) of each target
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    g = torch.Generator().manual_seed(seed)
    out: dict[str, object] = {}
    for i in range(c["num_hidden_layers"]):
        for target in LORA_TARGETS:
            block = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            stem = f"{PEFT_PREFIX}model.layers.{i}.{block}.{target}"
            d_in, d_out = dims[target]
            out[f"{stem}.lora_A.weight"] = (torch.randn(rank, d_in, generator=g) * 0.01).bfloat16()
            out[f"{stem}.lora_B.weight"] = (torch.randn(d_out, rank, generator=g) * 0.01).bfloat16()
    return out


def update_bench(size: str, rank: int, repeats: int, root: Path) -> dict[str, object]:
    """Issue 63 item 5 (module doc): an adapter update at `size` against its raw copy."""
    import asyncio
    import os

    import torch

    from rlkit.atomic import atomic_dir
    from rlkit.inference import start_server
    from rlkit.inference.admin import AdminClient
    from rlkit.inference.engine_args import lora_server_args
    from rlkit.inference.weights import check_adapter_dir
    from rlkit.models import init_tiny
    from rlkit.protocol import credentials, handoff
    from rlkit.protocol.model import LoraConfig
    from rlkit.trainer.lora import write_adapter

    token_file = root / "run.token"
    credentials.ensure_token_file(token_file)
    os.environ[credentials.TOKEN_FILE_ENV] = str(token_file)
    base = init_tiny(root / size, size=size)  # type: ignore[arg-type]
    cfg = LoraConfig(rank=rank, alpha=2.0 * rank)
    pair = [adapter_tensors(size, rank, seed) for seed in (0, 1)]
    nbytes = sum(t.numel() * t.element_size() for t in pair[0].values())  # type: ignore[attr-defined]
    targets = {k: torch.empty_like(t) for k, t in pair[0].items()}  # type: ignore[arg-type]

    def raw_copy(tensors: dict) -> float:
        t0 = time.perf_counter()
        for k, t in tensors.items():
            targets[k].copy_(t)
        return time.perf_counter() - t0

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's spinning OpenMP threads made 392 small copies 3-10x slower
    raw = statistics.median([raw_copy(pair[i % 2]) for i in range(repeats + 1)][1:])
    torch.set_num_threads(threads)
    work = root / "adapters"
    work.mkdir()

    def export(version: int) -> tuple[Path, float]:
        out = work / f"step_{version:06d}"
        t0 = time.perf_counter()
        with atomic_dir(out, durable=False) as tmp:
            write_adapter(tmp, pair[version % 2], cfg, str(base))  # type: ignore[arg-type]
        handoff.mark_published(out)
        return out, time.perf_counter() - t0

    args = [*lora_server_args(rank, 1), "--enforce-eager"]  # rlkit's engine defaults else
    server = start_server(
        str(base), log_path=root / "vllm-lora.log", extra_args=args, weights_roots=[work]
    )
    times: dict[str, list[float]] = {"export": [], "load": [], "http": [], "check": []}

    async def updates() -> None:
        async with server.client(adapter="policy", timeout=600) as client:
            admin = AdminClient(client)
            for version in range(1, repeats + 2):  # the first warms up
                path, export_s = export(version)
                t0 = time.perf_counter()
                await admin.load_adapter(str(path), version)
                t1 = time.perf_counter()
                await admin.status()
                t2 = time.perf_counter()
                check_adapter_dir(path)
                t3 = time.perf_counter()
                if version > 1:
                    for name, value in zip(
                        times, (export_s, t1 - t0, t2 - t1, t3 - t2), strict=True
                    ):
                        times[name].append(value)

    try:
        server.wait_ready(timeout=900)
        asyncio.run(updates())
    except RuntimeError:
        print((root / "vllm-lora.log").read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        server.stop()
    med = {f"{k}_s": statistics.median(v) for k, v in times.items()}
    update = med["export_s"] + med["load_s"]
    vllm_load = max(med["load_s"] - med["http_s"] - med["check_s"], 0.0)
    result: dict[str, object] = {
        "size": size,
        "rank": rank,
        "adapter_mb": round(nbytes / 2**20, 1),
        "raw_copy_s": raw,
        **med,
        "update_s": update,
        "vllm_load_s": vllm_load,
        "rlkit_s": update - vllm_load,
    }
    result["update_over_raw_copy"] = update / raw
    result["update_over_raw_copy_plus_vllm"] = update / (raw + vllm_load)
    result["rlkit_over_raw_copy"] = (update - vllm_load) / raw
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}


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
    parser.add_argument("--update-size", help="instead: an adapter update at this real shape")
    parser.add_argument("--repeats", type=int, default=5, help="updates timed (--update-size)")
    args = parser.parse_args()
    if args.update_size:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(update_bench(args.update_size, args.rank, args.repeats, Path(tmp))))
        return
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        out = sweep(args, args.work)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = sweep(args, Path(tmp))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
