"""The trainer's memory per parameter, step by step, under glibc's default allocator settings and
with big allocations always mapped, side by side in one run.

Each round runs each variant in a fresh process holding a real `Trainer` (one rank, full
weights, the default AdamW) on a model of `--size`, and takes `--steps` SFT steps on the same
random sequences (`--tokens` in all, two sequences). Before each step the process's high-water
mark is reset to its resident set (/proc/self/clear_refs); the step's peak (VmHWM) and the
resident set after it are read from /proc/self/status, per parameter of the model. Variants:
- `glibc`: the allocator as the trainer runs today;
- `mmap64k` / `mmap4m`: `MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB / 4 MiB: every allocation
  of that size or more is its own mapping, returned to the system when freed (by default glibc
  raises the threshold to the size of the largest block freed so far, up to 32 MiB, and serves
  blocks below it from its heaps, which keep freed memory resident); each new mapping is paid
  for in page faults when it is first written.

    python tests/benchmarks/bench_train_memory.py [--size qwen3-0.6b] [--steps 3] [--rounds 1]
        [--variants glibc,mmap64k,mmap4m]

Prints one JSON line: per variant and round each step's peak and resident bytes per parameter
and seconds; per variant against glibc, the ratio of the highest peak and of the later steps'
median time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.bench_children import json_line_of, status_kb  # noqa: E402

BASELINE = "glibc"
VARIANTS = {
    "glibc": {},
    "mmap64k": {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
    "mmap4m": {"MALLOC_MMAP_THRESHOLD_": str(4 * 1024 * 1024)},
}


def child(model: str, steps: int, tokens: int) -> None:
    """The steps in this process; prints their figures as JSON."""
    import torch

    from rlkit.trainer.config import ModelConfig, TrainerConfig
    from rlkit.trainer.packing import TokenSequence
    from rlkit.trainer.sft import sft_loss
    from rlkit.trainer.trainer import Trainer

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(0)
    length = tokens // 2
    prompt = length // 3
    seqs = [
        TokenSequence(
            torch.randint(0, min(vocab, 8192), (length,), generator=g).tolist(),
            [0] * prompt + [1] * (length - prompt),
            [0.0] * length,
        )
        for _ in range(2)
    ]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(TrainerConfig(run_dir=run_dir, model=ModelConfig(path=model)), steps)
        params = sum(p.numel() for p in trainer.policy.parameters())
        per_param = 1024 / params
        built = status_kb("VmRSS") * per_param
        peaks, resident, seconds = [], [], []
        for _ in range(steps):
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            result = trainer.train_step(seqs, sft_loss, normalizer=2.0 * (length - prompt))
            assert not result.skipped
            peaks.append(status_kb("VmHWM") * per_param)
            resident.append(status_kb("VmRSS") * per_param)
            seconds.append(result.metrics["step_time_s"])
        trainer.close()
    figures = {"params": params, "built": built, "step_peak": peaks, "step_resident": resident}
    print(json.dumps({**figures, "step_s": seconds}))


def rounded_figures(figures: dict) -> dict:
    return {
        k: [round(x, 2) for x in v] if isinstance(v, list) else round(v, 2)
        for k, v in figures.items()
    }


def run_child(variant: str, model: Path, steps: int, tokens: int) -> dict:
    """One variant in a fresh process with its allocator settings."""
    cmd = [sys.executable, __file__, "--child", "--model", str(model)]
    cmd += ["--steps", str(steps), "--tokens", str(tokens)]
    return json_line_of(cmd, ROOT, {**os.environ, **VARIANTS[variant]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", default="qwen3-0.6b", help="a shape `rlkit model init-tiny` knows")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=600, help="tokens per step (two sequences)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS), help="glibc first, then any others")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.model, args.steps, args.tokens)
        return

    from rlkit.models.tiny import init_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny(Path(tmp) / "model", size=args.size)
        runs: dict[str, list[dict]] = {name: [] for name in args.variants.split(",")}
        for _ in range(args.rounds):
            for variant in runs:
                runs[variant].append(run_child(variant, model, args.steps, args.tokens))
                print(f"[train-memory] {variant}: {runs[variant][-1]}", file=sys.stderr)
    highest = {v: statistics.median(max(r["step_peak"]) for r in rs) for v, rs in runs.items()}
    # the first step also allocates the optimizer's moments: the later ones are the steady state
    step_s = {
        v: statistics.median(s for r in rs for s in r["step_s"][1:]) for v, rs in runs.items()
    }
    rounded = {v: [rounded_figures(r) for r in rs] for v, rs in runs.items()}
    print(
        json.dumps(
            {
                "bench": "train_memory",
                "size": args.size,
                "steps": args.steps,
                "tokens_per_step": args.tokens,
                "bytes_per_param": rounded,
                "highest_peak": {v: round(x, 2) for v, x in highest.items()},
                "later_step_s": {v: round(x, 2) for v, x in step_s.items()},
                "over_glibc": {
                    v: {
                        "peak": highest[v] / highest[BASELINE],
                        "step_s": step_s[v] / step_s[BASELINE],
                    }
                    for v in runs
                    if v != BASELINE
                },
            }
        )
    )


if __name__ == "__main__":
    main()
