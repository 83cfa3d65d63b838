"""The exporting rank's memory while it gathers a version, the old way against the new, in one run.

`old`: what export did before: `get_model_state_dict(full_state_dict, cpu_offload)` (the whole
model gathered in fp32), then the bf16 cast beside it. `new`: `rlkit.trainer.export.gather_state`
(gathered and cast one tensor at a time). Each round runs each variant in a fresh process (so
neither inherits the other's heap) holding a real `Trainer` on a model of `--size`; the figure
is the exporting rank's high-water mark (VmHWM, reset through /proc/self/clear_refs just before)
above its resident set before the gather, per parameter of the model. With `--ranks 2` the
parameters are sharded, so gathering them makes full copies on rank 0. Both must gather the
same tensors (a digest of their sums is compared).

    python tests/benchmarks/bench_export_memory.py [--size qwen3-0.6b] [--rounds 2] [--ranks 2]

Prints one JSON line: bytes per parameter per variant and round, and new / old.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.bench_children import json_line_of, status_kb  # noqa: E402


def child(variant: str, model: str, write: bool) -> None:
    """One gather in this process; prints its figures as JSON."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from rlkit.trainer import dist
    from rlkit.trainer.config import ModelConfig, TrainerConfig
    from rlkit.trainer.export import gather_state
    from rlkit.trainer.trainer import Trainer

    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(TrainerConfig(run_dir=run_dir, model=ModelConfig(path=model)), 1)
        dtype = trainer.export_dtype
        params = sum(p.numel() for p in trainer.policy.parameters())
        gc.collect()
        before = status_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        if variant == "old":
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            full = get_model_state_dict(trainer.policy, options=options)
            state = {k: v.to(dtype) for k, v in full.items()}
        else:
            state = gather_state(trainer.policy, dtype)
        if write:
            from rlkit.weights.filesystem import save_tensors

            save_tensors(Path(run_dir), list(state.items()), None)
        peak = status_kb("VmHWM")
        if not dist.is_main():
            return
        digest = sum(float(t.float().sum()) for t in state.values())
        print(
            json.dumps(
                {
                    "bytes_per_param": (peak - before) * 1024 / params,
                    "params": params,
                    "tensors": len(state),
                    "digest": digest,
                    "dtype": str(dtype),
                    "torch": torch.__version__,
                }
            )
        )


def run_child(variant: str, model: Path, write: list[str], ranks: int) -> dict:
    """One variant in fresh processes (`ranks` of them under torchrun); rank 0's figures."""
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd = [*launch, __file__, "--child", variant, "--model", str(model), *write]
    return json_line_of(cmd, ROOT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", default="qwen3-0.6b", help="a shape `rlkit model init-tiny` knows")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--write", action="store_true", help="include writing the version's file")
    p.add_argument("--ranks", type=int, default=1, help="trainer processes (torchrun) per variant")
    p.add_argument("--child", choices=["old", "new"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.model, args.write)
        return

    from rlkit.models.tiny import init_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny(Path(tmp) / "model", size=args.size)
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for variant in runs:
                runs[variant].append(
                    run_child(variant, model, ["--write"] if args.write else [], args.ranks)
                )
                print(f"[export-memory] {variant}: {runs[variant][-1]}", file=sys.stderr)
    digests = {r["digest"] for rs in runs.values() for r in rs}
    median = {v: statistics.median(r["bytes_per_param"] for r in rs) for v, rs in runs.items()}
    print(
        json.dumps(
            {
                "bench": "export_memory",
                "size": args.size,
                "params": runs["new"][0]["params"],
                "write": args.write,
                "ranks": args.ranks,
                "bytes_per_param": {
                    v: [r["bytes_per_param"] for r in rs] for v, rs in runs.items()
                },
                "median_bytes_per_param": median,
                "new_over_old": median["new"] / median["old"],
                "same_tensors": len(digests) == 1,
            }
        )
    )


if __name__ == "__main__":
    main()
