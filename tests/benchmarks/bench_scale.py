"""The whole RL loop from toy to real shapes, and how each cost grows with parameters.

    python tests/benchmarks/bench_scale.py [--variants tiny,small,0.6b,0.6b-lora] [--steps 3]
        [--transfer auto|filesystem|ipc|broadcast]

Per variant, one `rlkit train` run on the CPU demo's reverse-text config with the sync
scheduler, `--steps` steps of `--groups` groups of 8, every completion forced to `--tokens`
tokens (`min_tokens` = `max_tokens`: every size does the same work), every group trained even
when its rewards are all equal (a random-init model solves nothing), a checkpoint at the last
step; then the trainer alone resumes from that checkpoint (its load time). Variants: `tiny` and
`small` (rlkit's toy shapes), `0.6b` (Qwen3-0.6B's shape: 28 layers, vocabulary 151,936, full
weights, fp32 AdamW) and `0.6b-lora` (the same base, LoRA rank 16 on every linear layer).

Measured per variant: parameters, engine start (launch to vLLM's "startup complete"),
generated tokens/s (completion tokens over the rollout phase), trainer tokens/s and s/step,
peak RSS of the trainer and of the engine (the kernel's high-water mark, VmHWM, summed over
each side's processes), weight-update seconds and bytes (through `--transfer`, the filesystem by
default), checkpoint save and load seconds and size, export seconds (the steps without a
checkpoint's settle), and the trainer's peak bytes per parameter. Then each cost's growth
exponent against parameters (least squares in log-log over the full-weight variants, and between
the two largest alone: at the toy end fixed costs dominate). A progress line per phase goes to
stderr; the one JSON line to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.bench_children import children, descendants, high_water_kb  # noqa: E402

RLKIT = str(Path(sys.executable).parent / "rlkit")
CONFIG = ROOT / "examples/tiny-cpu/train.toml"
SIZES = {"tiny": "tiny", "small": "small", "0.6b": "qwen3-0.6b", "0.6b-lora": "qwen3-0.6b"}
LORA = ["--model.lora.rank=16", "--model.lora.alpha=32"]
READY = "Application startup complete"
# costs whose growth against parameters the JSON line reports
GROWTH = [
    "engine_start_s",
    "trainer_step_s",
    "trainer_peak_rss_gb",
    "engine_peak_rss_gb",
    "weight_update_s",
    "weight_update_bytes",
    "export_s",
    "checkpoint_save_s",
    "checkpoint_load_s",
    "checkpoint_bytes",
]


def progress(message: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class PeakRss:
    """Peak RSS of a run's trainer and engine sides: each side's processes (from pids.json and
    their descendants) summed, each process at its own high-water mark, polled until it goes."""

    def __init__(self, run_dir: Path) -> None:
        self.pids = run_dir / "pids.json"
        self.peak_kb: dict[int, int] = {}
        self.side: dict[int, str] = {}

    def poll(self) -> None:
        try:
            named = json.loads(self.pids.read_text())
        except (OSError, ValueError):
            return
        tree = children()
        for name, pids in named.items():
            side = "trainer" if name.startswith("trainer") else "engine"
            for root in pids:
                for pid in descendants(root, tree):
                    self.side.setdefault(pid, side)
                    self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), high_water_kb(pid))

    def gb(self, side: str) -> float:
        kb = sum(v for pid, v in self.peak_kb.items() if self.side[pid] == side)
        return round(kb / 2**20, 3)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build_model(size: str, out: Path) -> int:
    """Build the model of `size` in `out`, or reuse the one a `--keep` run left there."""
    meta = out / "rlkit_model.json"
    if meta.is_file() and json.loads(meta.read_text())["size"] == size:
        progress(f"reusing {out}")
        return json.loads(meta.read_text())["parameters"]
    progress(f"init {size} -> {out}")
    t = time.monotonic()
    init = [RLKIT, "model", "init-tiny", "--size", size, "--out", str(out)]
    subprocess.run(init, check=True, stdout=sys.stderr)  # stdout: the one JSON line
    params = json.loads((out / "rlkit_model.json").read_text())["parameters"]
    progress(f"init {size}: {params:,} parameters in {time.monotonic() - t:.0f} s")
    return params


def train_cmd(model: Path, run_dir: Path, args: argparse.Namespace, lora: bool) -> list[str]:
    sampling = f"{{temperature = 1.0, max_tokens = {args.tokens}, min_tokens = {args.tokens}}}"
    return [
        RLKIT,
        "train",
        str(CONFIG),
        f"--model.path={model}",
        f"--log.run_dir={run_dir}",
        "--log.plot=false",
        "--orchestrator.scheduler=sync",
        f"--orchestrator.schedulers.sync.batch_groups={args.groups}",
        f"--orchestrator.max_steps={args.steps}",
        f"--orchestrator.sampling={sampling}",
        "--orchestrator.eval.at_start=false",
        "--orchestrator.eval.at_end=false",
        # a random-init model solves nothing: its groups (every reward 0) are trained anyway,
        # and the watchdog, which would stop a run without signal, lets this one go on
        "--orchestrator.drop_zero_advantage=false",
        "--orchestrator.watchdog.stop_groups=1000000",
        f"--ckpt.interval={args.steps}",
        f"--trainer.weights.keep_last={args.steps + 1}",
        '--inference.extra_args=["--max-num-seqs", "64", "--max-model-len", "512", '
        '"--enforce-eager"]',
        # LoRA's adapters go as files whatever the transport
        *(LORA if lora else [f"--inference.weight_transfer={args.transfer}"]),
    ]


def watch(cmd: list[str], run_dir: Path, log: Path, timeout: float) -> tuple[PeakRss, float]:
    """Run `cmd`, polling its processes' memory; returns the peaks and the engine start (s)."""
    rss = PeakRss(run_dir)
    t0 = time.monotonic()
    ready_s = math.nan
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        seen_step = 0
        while proc.poll() is None:
            rss.poll()
            if math.isnan(ready_s) and any(
                READY in f.read_text(errors="ignore")
                for f in (run_dir / "logs").glob("inference-*.log")
            ):
                ready_s = time.monotonic() - t0
                progress(f"  engine ready after {ready_s:.0f} s")
            steps = read_jsonl(run_dir / "trainer_metrics.jsonl")
            if len(steps) > seen_step:
                seen_step = len(steps)
                last = steps[-1]
                progress(
                    f"  step {last['step']}: trainer {last['step_time_s']:.1f} s, "
                    f"trainer peak {rss.gb('trainer'):.2f} GB, engine {rss.gb('engine'):.2f} GB"
                )
            if time.monotonic() - t0 > timeout:
                proc.kill()
                sys.exit(f"{cmd[1]} timed out after {timeout:.0f} s; log {log}")
            time.sleep(0.5)
    if proc.returncode:
        sys.exit(f"rlkit train failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return rss, ready_s


def resume_alone(run_dir: Path, log: Path) -> tuple[float, float]:
    """The trainer alone resumes from the run's last checkpoint (max_steps already reached, so it
    trains nothing): (its load seconds, its peak RSS GB)."""
    cmd = [
        sys.executable,
        "-m",
        "rlkit.trainer.main",
        "--config",
        str(run_dir / "trainer.toml"),
        "--mode",
        "rl",
        "--resume",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, high_water_kb(proc.pid))
            time.sleep(0.2)
    if proc.returncode:
        sys.exit(f"trainer resume failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    loads = [c["resume_s"] for c in read_jsonl(run_dir / "trainer_costs.jsonl") if "resume_s" in c]
    return loads[-1], round(peak / 2**20, 3)


def run_variant(name: str, model: Path, params: int, root: Path, args) -> dict:
    lora = name.endswith("-lora")
    run_dir = root / name
    progress(f"{name}: rlkit train, {args.steps} steps")
    t = time.monotonic()
    rss, ready_s = watch(
        train_cmd(model, run_dir, args, lora), run_dir, root / f"{name}.log", args.timeout
    )
    wall = time.monotonic() - t
    orch = read_jsonl(run_dir / "metrics.jsonl")
    trainer = read_jsonl(run_dir / "trainer_metrics.jsonl")
    costs = read_jsonl(run_dir / "trainer_costs.jsonl")
    ckpt = run_dir / "checkpoints"
    ckpt_dirs = [d for d in ckpt.iterdir() if d.is_dir()]
    progress(f"{name}: trainer resumes alone from {ckpt_dirs[-1].name}")
    load_s, load_rss = resume_alone(run_dir, root / f"{name}-resume.log")
    later = orch[1:] or orch  # the first step also pays the engine's warm-up
    gen = [r["batch_tokens"] for r in later]
    trainer_peak = rss.gb("trainer")
    out = {
        "parameters": params,
        "trainable": "lora" if lora else "full",
        "wall_s": round(wall, 1),
        "engine_start_s": round(ready_s, 1),
        "generated_tok_s": round(
            statistics.fmean(
                r["tokens_per_s"] * r["step_time_s"] / r["rollout_time_s"] for r in later
            ),
            1,
        ),
        "step_s": round(statistics.fmean(r["step_time_s"] for r in later), 2),
        "batch_tokens": int(statistics.fmean(gen)),
        "trainer_step_s": round(
            statistics.fmean(r["step_time_s"] for r in trainer[1:] or trainer), 2
        ),
        "trainer_tok_s": round(
            statistics.fmean(r["tokens_per_s"] for r in trainer[1:] or trainer), 1
        ),
        "trainer_peak_rss_gb": trainer_peak,
        "engine_peak_rss_gb": rss.gb("engine"),
        "trainer_bytes_per_param": round(trainer_peak * 2**30 / params, 2),
        "weight_update_s": round(statistics.fmean(r["weight_update_s"] for r in later), 3),
        "weight_update_bytes": int(statistics.fmean(r["weight_update_bytes"] for r in later)),
        "export_s": round(
            statistics.fmean(c["export_s"] for c in costs if "checkpoint_s" not in c), 3
        ),
        "checkpoint_save_s": round(
            next(c["checkpoint_s"] for c in costs if "checkpoint_s" in c), 2
        ),
        "checkpoint_load_s": round(load_s, 2),
        "checkpoint_load_peak_rss_gb": load_rss,
        "checkpoint_bytes": dir_bytes(ckpt_dirs[-1]),
    }
    progress(f"{name}: {json.dumps(out)}")
    return out


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Slope of log y against log x (least squares); None without two positive points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", default="tiny,small,0.6b,0.6b-lora")
    parser.add_argument("--steps", type=int, default=3, help="RL steps per variant")
    parser.add_argument("--groups", type=int, default=2, help="groups of 8 per step")
    parser.add_argument("--tokens", type=int, default=16, help="tokens of every completion")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per variant")
    parser.add_argument(
        "--transfer", default="auto", help="the full-weight runs' inference.weight_transfer"
    )
    parser.add_argument("--keep", default="", help="keep the runs under this directory")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in SIZES]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; choose from {list(SIZES)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.keep or None) as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        models: dict[str, tuple[Path, int]] = {}
        results: dict[str, dict] = {}
        for name in variants:
            size = SIZES[name]
            if size not in models:
                models[size] = (root / f"model-{size}", 0)
                models[size] = (models[size][0], build_model(size, models[size][0]))
            model, params = models[size]
            results[name] = run_variant(name, model, params, root, args)
    full = [r for r in results.values() if r["trainable"] == "full"]
    params = [r["parameters"] for r in full]
    growth = {key: exponent(params, [float(r[key]) for r in full]) for key in GROWTH}
    # the two largest full-weight variants alone: at the toy end fixed costs dominate
    top = sorted(full, key=lambda r: r["parameters"])[-2:]
    top_growth = {
        key: exponent([r["parameters"] for r in top], [float(r[key]) for r in top])
        for key in GROWTH
    }
    out: dict = {
        "bench": "scale",
        "steps": args.steps,
        "samples_per_step": 8 * args.groups,
        "completion_tokens": args.tokens,
        "transfer": args.transfer,
        "variants": results,
        "growth_exponent_vs_parameters": growth,
        "growth_exponent_two_largest": top_growth,
    }
    if "0.6b" in results and "0.6b-lora" in results:
        f, lo = results["0.6b"], results["0.6b-lora"]
        out["lora_over_full_0.6b"] = {
            key: round(lo[key] / f[key], 3)
            for key in ("trainer_step_s", "trainer_peak_rss_gb", "weight_update_bytes")
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
