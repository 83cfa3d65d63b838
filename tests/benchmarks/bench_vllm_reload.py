"""Where vLLM's own reload of a weight update goes on the CPU (issue 63: "vLLM's reload share
named at each size, and what would remove it"), against a plain copy of the same bytes.

    python tests/benchmarks/bench_vllm_reload.py [--size qwen3-0.6b] [--repeats 3]

Builds a model at `--size`'s real shapes (`rlkit.models.init_tiny`), starts vLLM's engine in
this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, eager) and reloads its own tensors in place
through the call a worker makes for every transport (`Worker.reload_weights` with a weights
iterator: vLLM's generic layerwise reload). Times `--repeats` reloads (after one to warm up),
then profiles one more with cProfile and splits it:

- `onednn_pack_s`: the CPU backend's repacking of every linear layer's weight for oneDNN
  (`create_onednn_mm_handler`, inside each layer's `process_weights_after_loading`): vLLM's CPU
  kernel format, which only the engine can make;
- `copy_s`: tensor copies (`Tensor.copy_`: the loaders' copies into the fused parameters, the
  layerwise reload's copy back into the kernel tensors);
- `rest_s`: everything else (the layerwise machinery: meta restore, materialise, loader wraps).

`plain_copy_s` is one copy of the same tensors into preallocated ones (the floor of any load;
`tests/helpers/bench_copy.py`, as `bench_weight_update.py` times it).
Prints one JSON line with the medians, the profiled split and each part's share.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core, and its worker, in here
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as rlkit runs its CPU engines

import torch  # noqa: E402

from rlkit.models import init_tiny  # noqa: E402
from rlkit.protocol.weights import iter_safetensors  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.bench_copy import plain_copy_s  # noqa: E402


def profiled_split(profile: cProfile.Profile) -> dict[str, float]:
    """Seconds of the oneDNN repacking and of tensor copies in `profile`, and the total."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    pack = copy = 0.0
    for (_, _, name), (_, _, own, _, _) in stats.items():
        if "create_onednn_mm_handler" in name:
            pack += own
        elif name == "<method 'copy_' of 'torch._C.TensorBase' objects>":
            copy += own
    total = pstats.Stats(profile).total_tt  # type: ignore[attr-defined]
    return {"onednn_pack_s": pack, "copy_s": copy, "rest_s": total - pack - copy, "total_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from vllm import LLM

    with tempfile.TemporaryDirectory() as tmp:
        model = init_tiny(Path(tmp) / args.size, size=args.size)  # type: ignore[arg-type]
        tensors = [(n, t.clone()) for n, t in iter_safetensors(model)]
        targets = {n: torch.empty_like(t) for n, t in tensors}
        copy_s = plain_copy_s(tensors, targets, args.repeats)
        del targets
        llm = LLM(
            model=str(model),
            max_model_len=512,
            kv_cache_memory_bytes=256 << 20,
            enforce_eager=True,
        )
        worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        reloads = []
        for _ in range(args.repeats + 1):
            t0 = time.perf_counter()
            worker.reload_weights(weights_iterator=iter(tensors))
            reloads.append(time.perf_counter() - t0)
        profile = cProfile.Profile()
        profile.enable()
        worker.reload_weights(weights_iterator=iter(tensors))
        profile.disable()
    split = profiled_split(profile)
    out = {
        "bench": "vllm_reload",
        "size": args.size,
        "mbytes": round(sum(t.numel() * t.element_size() for _, t in tensors) / 1e6, 1),
        "reload_s": round(statistics.median(reloads[1:]), 4),
        "plain_copy_s": round(copy_s, 4),
        "profiled": {k: round(v, 4) for k, v in split.items()},
        "shares": {
            k.removesuffix("_s"): round(split[k] / split["total_s"], 3)
            for k in ("onednn_pack_s", "copy_s", "rest_s")
        },
        "load": os.getloadavg()[0],
    }
    out["reload_over_copy"] = round(out["reload_s"] / out["plain_copy_s"], 2)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
