"""Optimiser step time: Muon (rlkit.trainer.muon) vs AdamW on the `small` tiny model, 1 and 2 ranks.

    python tests/benchmarks/bench_optim.py [--steps 5]

Builds the model locally, then runs this file as the rank script under torchrun (gloo, CPU) with
1 and then 2 ranks. Each rank run shards the fp32 model with FSDP2 as the trainer does (one unit
per decoder layer, then the root), computes gradients once and times `optimizer.step()` of both
optimisers, interleaved, best of `--steps` after a warm-up. Prints one JSON line: seconds per
step for each (optimiser, ranks) and the Muon/AdamW ratio per rank count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlkit.trainer.config import OptimConfig
from rlkit.trainer.optim import build_optimizer

OPTIMIZERS = ("adamw", "muon")


def rank_main(model_dir: str, out: str, steps: int) -> None:
    """Time both optimisers' steps on this rank's shards; rank 0 writes {name: best seconds}."""
    import torch.distributed as tdist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    tdist.init_process_group("gloo")
    torch.manual_seed(0)
    best = {}
    models, optimizers = {}, {}
    for name in OPTIMIZERS:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        ids = torch.randint(0, model.config.vocab_size, (2, 128), generator=torch.Generator())
        model(input_ids=ids, labels=ids).loss.backward()
        models[name] = model
        optimizers[name], _ = build_optimizer(model, OptimConfig(name=name, lr=1e-4), 1)
        best[name] = float("inf")
    for i in range(steps + 1):
        for name in OPTIMIZERS:
            tdist.barrier()
            start = time.perf_counter()
            optimizers[name].step()
            tdist.barrier()
            if i:  # the first step allocates the optimiser state
                best[name] = min(best[name], time.perf_counter() - start)
    if tdist.get_rank() == 0:
        Path(out).write_text(json.dumps(best))
    tdist.destroy_process_group()


def main() -> None:
    from rlkit.models import init_tiny
    from rlkit.trainer.main import TrainerRanks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per optimiser")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_tiny(Path(tmp) / "small", size="small", seed=0)
        for ranks in (1, 2):
            out = Path(tmp) / f"ranks{ranks}.json"
            cmd = [sys.executable, *TrainerRanks(nproc=ranks).torchrun_args(), __file__]
            subprocess.run([*cmd, str(model_dir), str(out), str(args.steps)], env=env, check=True)
            times = json.loads(out.read_text())
            for name in OPTIMIZERS:
                result[f"{name}_step_s_{ranks}rank"] = round(times[name], 4)
            result[f"muon_over_adamw_{ranks}rank"] = round(times["muon"] / times["adamw"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) == 4 and not sys.argv[1].startswith("-"):
        rank_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    else:
        main()
