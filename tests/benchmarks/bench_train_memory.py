"""The trainer's memory per parameter, step by step and phase by phase, under glibc's default
allocator settings and under others (big allocations always mapped, one heap), side by side in
one run.

Each round runs each variant in a fresh process holding a real `Trainer` (one rank, the default
AdamW; full weights, or a LoRA adapter of `--lora-rank` on every linear layer, alpha twice the rank,
as bench_scale's `0.6b-lora`) on a model of `--size`, and takes `--steps` SFT steps on the same
random sequences (`--tokens` in all, two sequences). The load's peak is the process's high-water
mark (VmHWM) once the `Trainer` is built, its time the `Trainer`'s construction. Each step is split
into its phases, forward, backward (with the loss) and optimizer (clipping, the step, zeroing the
gradients), by hooks on the real `train_step`: the policy's forward pre- and post-hooks and a
wrapper of the optimizer step. Before each phase the high-water mark is reset to the resident set
(/proc/self/clear_refs); after it the phase's peak, the resident set and the bytes malloc holds for
live blocks (glibc's mallinfo2: in its heaps and mapped; the rest of the resident set is freed
blocks glibc keeps, the runtime's code and its own mappings) are read, all per parameter of the
model (its base parameters with LoRA). Variants:
- `glibc`: the allocator as the trainer runs today;
- `mmap64k` / `mmap4m`: `MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB / 4 MiB: every allocation
  of that size or more is its own mapping, returned to the system when freed (by default glibc
  raises the threshold to the size of the largest block freed so far, up to 32 MiB, and serves
  blocks below it from its heaps, which keep freed memory resident); each new mapping is paid
  for in page faults when it is first written;
- `arena1`: `MALLOC_ARENA_MAX=1`: every thread allocates from the one main heap (by default
  glibc gives threads that contend for it heaps of their own, up to 8 per core, each keeping
  its own freed blocks);
- `tcmalloc` / `jemalloc`: that allocator preloaded (`LD_PRELOAD`) with its defaults, as
  `rlkit train` and `rlkit sft` start their trainers with `trainer.allocator = "tcmalloc"` /
  `"jemalloc"` (`rlkit.trainer.allocator`; `glibc` is `trainer.allocator = "system"`).

    python tests/benchmarks/bench_train_memory.py [--size qwen3-0.6b] [--steps 3] [--rounds 1]
        [--variants glibc,mmap64k,mmap4m,arena1,tcmalloc,jemalloc] [--lora-rank 16]
        [--activation-checkpointing]

Prints one JSON line: per variant and round the load's peak, resident set and seconds, each step's
peak, resident bytes and seconds and each phase's peak, resident and live bytes, per parameter; per
variant against glibc, the ratio of the highest peak (load or step) and of the later steps' median
time.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rlkit.trainer.allocator import with_allocator  # noqa: E402
from tests.helpers.bench_children import json_line_of, status_kb  # noqa: E402

BASELINE = "glibc"
VARIANTS = {
    "glibc": {},
    "mmap64k": {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
    "mmap4m": {"MALLOC_MMAP_THRESHOLD_": str(4 * 1024 * 1024)},
    "arena1": {"MALLOC_ARENA_MAX": "1"},
    "tcmalloc": {},  # these two: `rlkit.trainer.allocator.with_allocator`, as the trainer's
    "jemalloc": {},
}


PHASES = ("forward", "backward", "optimizer")
PHASE_FIGURES = ("peak", "resident", "live")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_live_kb() -> int:
    """kB malloc hands out as live blocks now: glibc's in its heaps (all arenas) and mapped
    alone, or a preloaded jemalloc's or tcmalloc's own count of allocated bytes."""
    process = ctypes.CDLL(None)
    value, size = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    if hasattr(process, "mallctl"):  # jemalloc: refresh its statistics, then read them
        epoch = ctypes.c_uint64(1)
        process.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
        process.mallctl(b"stats.allocated", ctypes.byref(value), ctypes.byref(size), None, 0)
        return value.value // 1024
    if hasattr(process, "MallocExtension_GetNumericProperty"):  # tcmalloc
        name = b"generic.current_allocated_bytes"
        process.MallocExtension_GetNumericProperty(name, ctypes.byref(value))
        return value.value // 1024
    process.mallinfo2.restype = _Mallinfo2
    info = process.mallinfo2()
    return (info.uordblks + info.hblkhd) // 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


class PhaseMemory:
    """Peak, resident and live bytes per parameter of each phase of the trainer's steps, read
    through hooks on the real step (so the step under test is `Trainer.train_step` itself)."""

    def __init__(self, trainer: Any, per_param: float) -> None:
        self.per_param = per_param
        self.phases: list[dict[str, dict[str, float]]] = []
        trainer.policy.register_forward_pre_hook(lambda *_: self.start(), prepend=True)
        trainer.policy.register_forward_hook(lambda *_: self.end("forward"))
        step = trainer._optimizer_step

        def timed_step(nonfinite: bool) -> tuple[float, bool]:
            self.end("backward")
            out = step(nonfinite)
            self.end("optimizer")
            return out

        trainer._optimizer_step = timed_step

    def start(self) -> None:
        self.phases.append({})
        reset_peak()

    def end(self, phase: str) -> None:
        """Record `phase`'s figures and reset the peak for the next one."""
        self.phases[-1][phase] = {
            "peak": status_kb("VmHWM") * self.per_param,
            "resident": status_kb("VmRSS") * self.per_param,
            "live": malloc_live_kb() * self.per_param,
        }
        reset_peak()


def child(model: str, steps: int, tokens: int, lora_rank: int, checkpointing: bool) -> None:
    """The steps in this process; prints their figures as JSON."""
    import torch

    from rlkit.protocol.model import LoraConfig
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
    lora = LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank) if lora_rank else LoraConfig()
    with tempfile.TemporaryDirectory() as run_dir:
        model_cfg = ModelConfig(path=model, lora=lora, activation_checkpointing=checkpointing)
        cfg = TrainerConfig(run_dir=run_dir, model=model_cfg)
        start = time.perf_counter()
        trainer = Trainer(cfg, steps)
        load_s = time.perf_counter() - start
        named = trainer.policy.named_parameters()
        params = sum(p.numel() for name, p in named if ".lora_" not in name)
        per_param = 1024 / params
        load_peak, built = status_kb("VmHWM") * per_param, status_kb("VmRSS") * per_param
        memory = PhaseMemory(trainer, per_param)
        peaks, resident, seconds = [], [], []
        for _ in range(steps):
            reset_peak()
            result = trainer.train_step(seqs, sft_loss, normalizer=2.0 * (length - prompt))
            assert not result.skipped
            peaks.append(max(p["peak"] for p in memory.phases[-1].values()))
            resident.append(status_kb("VmRSS") * per_param)
            seconds.append(result.metrics["step_time_s"])
        trainer.close()
    figures = {"params": params, "load_peak": load_peak, "built": built, "load_s": load_s}
    figures |= {"step_peak": peaks, "step_resident": resident, "step_s": seconds}
    phases = {
        phase: {key: [step[phase][key] for step in memory.phases] for key in PHASE_FIGURES}
        for phase in PHASES
    }
    print(json.dumps({**figures, "phases": phases}))


def rounded_figures(figures: Any) -> Any:
    """`figures` with every number rounded to 2 decimals (nested dicts and lists alike)."""
    if isinstance(figures, dict):
        return {k: rounded_figures(v) for k, v in figures.items()}
    if isinstance(figures, list):
        return [rounded_figures(x) for x in figures]
    return round(figures, 2)


def run_child(variant: str, model: Path, args: argparse.Namespace) -> dict:
    """One variant in a fresh process with its allocator settings."""
    cmd = [sys.executable, __file__, "--child", "--model", str(model)]
    cmd += ["--steps", str(args.steps), "--tokens", str(args.tokens)]
    cmd += ["--lora-rank", str(args.lora_rank)]
    cmd += ["--activation-checkpointing"] if args.activation_checkpointing else []
    env = {**os.environ, **VARIANTS[variant]}
    if variant in ("tcmalloc", "jemalloc"):
        env = with_allocator(env, variant, cuda=False)
    return json_line_of(cmd, ROOT, env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", default="qwen3-0.6b", help="a shape `rlkit model init-tiny` knows")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=600, help="tokens per step (two sequences)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS), help="glibc first, then any others")
    p.add_argument("--lora-rank", type=int, default=0, help="0: full weights")
    p.add_argument("--activation-checkpointing", action="store_true", help="model's option")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.model, args.steps, args.tokens, args.lora_rank, args.activation_checkpointing)
        return

    from rlkit.models.tiny import init_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny(Path(tmp) / "model", size=args.size)
        runs: dict[str, list[dict]] = {name: [] for name in args.variants.split(",")}
        for _ in range(args.rounds):
            for variant in runs:
                runs[variant].append(run_child(variant, model, args))
                print(f"[train-memory] {variant}: {runs[variant][-1]}", file=sys.stderr)
    highest = {
        v: statistics.median(max(r["load_peak"], *r["step_peak"]) for r in rs)
        for v, rs in runs.items()
    }
    # the first step also allocates the optimizer's moments: the later ones are the steady state
    step_s = {
        v: statistics.median(s for r in rs for s in r["step_s"][1:] or r["step_s"])
        for v, rs in runs.items()
    }
    rounded = {v: [rounded_figures(r) for r in rs] for v, rs in runs.items()}
    print(
        json.dumps(
            {
                "bench": "train_memory",
                "size": args.size,
                "steps": args.steps,
                "tokens_per_step": args.tokens,
                "lora_rank": args.lora_rank,
                "activation_checkpointing": args.activation_checkpointing,
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
