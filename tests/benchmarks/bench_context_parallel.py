"""Context parallelism's memory and time: per-rank peak of one training step on one long
sequence with `context_parallel = 2` against `= 1`, both on two gloo ranks.

Both variants run under `torchrun --nproc-per-node 2`, so FSDP2 shards the parameters and the
optimiser state over two ranks alike and only the activations differ: with cp = 1 the ranks are
two data-parallel groups and the one sequence runs whole on each (the second rank repeats it
with loss weight 0, as the trainer pads a rank with fewer micro-batches), with cp = 2 each rank
holds half of it. Each length runs in fresh processes holding a real `Trainer` (model `--size`,
AdamW, full weights) and takes one SFT step on every token: its peak resident set (VmHWM, reset
to the resident set once the trainer is built, through /proc/self/clear_refs; it includes AdamW's
state, created in the step, the same in both variants) and its time. A rank whose resident set
passes `--cap-gib` ends the run of that length: it "does not fit", and longer lengths of that
variant are not tried (the machine is shared). The ranks run with the trainer's allocator
(`--allocator`, default `auto`: tcmalloc where installed, as `rlkit train` starts them).

    python tests/benchmarks/bench_context_parallel.py [--size small] [--lengths 2048,4096,8192]
        [--cap-gib 6] [--activation-checkpointing] [--allocator auto] [--layers N]
        [--variants cp1,cp2] [--logprob-chunk-size 1024]

`--size` is a toy shape (`small`) or a real one (`qwen3-0.6b`: its width, heads and 151,936-token
vocabulary); `--layers N` keeps the shape's widths with N decoder layers (a real stack's 28 do not
fit this machine's step time), so the figures are per layer kept, not the released model's.
`--variants` runs only some of the two (e.g. cp2 against another checkout's); `--logprob-chunk-size`
is the trainer's `logprob_chunk_size` (rows of the head's logits at a time).

Prints one JSON line: per variant and length the per-rank peak (GiB, the larger rank) and the
step time; the longest length each variant fits under the cap; per length both fit, the
ratio of cp = 2's peak and step time to cp = 1's, and those ratios at the longest length cp = 1
reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.bench_children import status_kb  # noqa: E402

GIB = 2**30


def child(
    model_dir: str, length: int, cp: int, cap_gib: float, checkpointing: bool, chunk: int
) -> None:
    """One torchrun rank: one step on one sequence of `length`; rank 0 prints the JSON line."""
    import torch

    from rlkit.protocol.model import ModelConfig
    from rlkit.trainer import dist
    from rlkit.trainer.config import TrainerConfig
    from rlkit.trainer.packing import TokenSequence
    from rlkit.trainer.sft import sft_loss
    from rlkit.trainer.trainer import Trainer

    def watch() -> None:  # a shared machine: stop before the cap, not at the OOM killer
        while True:
            if status_kb("VmRSS") * 1024 > cap_gib * GIB:
                print(json.dumps({"fits": False}), flush=True)
                os._exit(3)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    cfg = TrainerConfig(
        run_dir=str(Path(tempfile.mkdtemp()) / "run"),
        model=ModelConfig(path=model_dir, activation_checkpointing=checkpointing),
        micro_batch_tokens=length,
        context_parallel=cp,
        collective_timeout_s=1800,
        logprob_chunk_size=chunk,
    )
    trainer = Trainer(cfg, total_steps=10)
    vocab = trainer.policy.lm.config.vocab_size
    ids = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    seqs = [TokenSequence(ids, [0] * 16 + [1] * (length - 16), [0.0] * length)]
    normalizer = float(length - 16)
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    trainer.train_step(seqs, sft_loss, normalizer)
    elapsed = time.perf_counter() - t0
    peaks = [0.0] * dist.world_size()
    peaks[dist.rank()] = status_kb("VmHWM") * 1024 / GIB
    peaks = dist.all_reduce_sum(peaks)
    if dist.is_main():
        print(json.dumps({"fits": True, "peak_gib": peaks, "step_s": elapsed}), flush=True)
    trainer.close(wait_for_peers=True)


def make_model(tmp: Path, size: str, layers: int) -> Path:
    """A random-init model of shape `size`, with `layers` decoder layers when nonzero."""
    from rlkit.models import init_tiny
    from rlkit.models.shapes import REAL_SHAPES, real_config
    from rlkit.models.tiny import MAX_POSITIONS, SHAPES, build_config

    if not layers:
        return init_tiny(tmp / "model", size=size, seed=0)
    if size in REAL_SHAPES:
        config = real_config(size, 0, 0, MAX_POSITIONS)
    else:
        config = build_config("qwen3", size, SHAPES[size]["vocab_size"], 0, 0)
    fields = {**config.to_dict(), "num_hidden_layers": layers}
    fields.pop("layer_types", None)  # derived from the layer count
    path = tmp / "config.json"
    path.write_text(json.dumps(fields))
    return init_tiny(tmp / "model", seed=0, config_file=path)


def run_variant(model_dir: Path, length: int, cp: int, args: argparse.Namespace) -> dict:
    from rlkit.trainer.allocator import with_allocator
    from rlkit.trainer.main import TrainerRanks

    cmd = [sys.executable, *TrainerRanks(nproc=2).torchrun_args(), __file__, "--child"]
    cmd += [str(model_dir), str(length), str(cp), str(args.cap_gib)]
    cmd += ["1" if args.activation_checkpointing else "0", str(args.logprob_chunk_size)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env = with_allocator(env, args.allocator, cuda=False)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"cp={cp} L={length}: no result\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1])
    if result["fits"]:
        result["peak_gib"] = max(result["peak_gib"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--cap-gib", type=float, default=6.0, help="per-rank resident cap")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument(
        "--layers", type=int, default=0, help="decoder layers kept (0: the shape's own)"
    )
    parser.add_argument("--variants", default="cp1,cp2", help="which of cp1, cp2 to run")
    parser.add_argument("--logprob-chunk-size", type=int, default=1024)
    parser.add_argument(
        "--allocator",
        default="auto",
        help="the ranks' malloc, as trainer.allocator (auto: tcmalloc where installed, as "
        "`rlkit train` starts its trainer; system: glibc)",
    )
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    results: dict[str, dict[str, dict]] = {"cp1": {}, "cp2": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp), args.size, args.layers)
        for name, cp in (("cp1", 1), ("cp2", 2)):
            if name not in args.variants.split(","):
                continue
            for length in lengths:
                result = run_variant(model_dir, length, cp, args)
                results[name][str(length)] = result
                print(f"{name} L={length}: {result}", file=sys.stderr, flush=True)
                if not result["fits"]:
                    break
    longest = {
        name: max((int(n) for n, r in runs.items() if r["fits"]), default=0)
        for name, runs in results.items()
    }
    ratios = {}
    for n, r1 in results["cp1"].items():
        r2 = results["cp2"].get(n)
        if r1["fits"] and r2 and r2["fits"]:
            ratios[n] = {
                "peak_ratio": r2["peak_gib"] / r1["peak_gib"],
                "step_time_ratio": r2["step_s"] / r1["step_s"],
            }
    line = {
        "size": args.size,
        "layers": args.layers or None,
        "cap_gib": args.cap_gib,
        "activation_checkpointing": args.activation_checkpointing,
        "allocator": args.allocator,
        "logprob_chunk_size": args.logprob_chunk_size,
        "results": results,
        "longest_fitting": longest,
        "ratios": ratios,
        "at_longest_cp1": ratios.get(str(longest["cp1"])),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        model, length, cp, cap, ckpt, chunk = sys.argv[2:8]
        child(model, int(length), int(cp), float(cap), ckpt == "1", int(chunk))
    else:
        main()
