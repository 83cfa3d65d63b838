"""The tensor table's keyed digests (`rlkit.protocol.weights`) against a plain copy of the same
bytes, in one process, at a real model's shapes (issue 63: "the check <= 1.5x a plain copy").

    python tests/benchmarks/bench_digest.py [--size qwen3-0.6b] [--repeats 5] [--torch-threads N]

Builds random bf16 tensors at `--size`'s shapes (`rlkit.models.shapes`: qwen3-0.6b is 1.19 GB,
tied embeddings) and times, interleaved `--repeats` times (the first round warms up):

- `copy_s`: every tensor copied into a preallocated one of its shape (the bytes read once and
  written once: the floor of any step that moves them);
- `table_s`: the trainer's tensor table (`tensor_table`: one keyed BLAKE3 per tensor, on a
  thread per core and BLAKE3's own threads inside big tensors);
- `verify_s`: a worker's check of received tensors against it (`mismatches`);
- the trainer's export as `rlkit.trainer.export` runs it on the exporting rank: each fp32 tensor
  cast into a new bf16 CPU tensor one at a time (`gather_s`, the gather of a single rank), then
  the table after the gather (`gather_then_table_s`, the order before issue 63) or each tensor
  handed to the `Digester` as soon as it is cast (`gather_digesting_s`, the export now).

Prints one JSON line: medians, GB/s and the ratios to the copy. `--torch-threads` (default: torch's
own) sets torch's intra-op threads, which the copies and casts use: on a loaded 2-core machine
torch's two spinning OpenMP threads made the copy 10-20x slower than one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from rlkit.models.shapes import REAL_SHAPES
from rlkit.protocol.credentials import digest_key, new_token
from rlkit.protocol.weights import Digester, mismatches, tensor_table


def qwen3_shapes(size: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a dense Qwen3 at `size` (tied embeddings)."""
    c = REAL_SHAPES[size]
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (hd,)),
            (p + "self_attn.k_norm.weight", (hd,)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
    return out + [("model.norm.weight", (h,))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch-threads", type=int, default=0)
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    g = torch.Generator().manual_seed(0)
    master = [(n, torch.randn(s, generator=g) * 0.02) for n, s in qwen3_shapes(args.size)]
    tensors = [(n, t.bfloat16()) for n, t in master]
    targets = [torch.zeros_like(t) for _, t in tensors]
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    key = digest_key(new_token())
    table = tensor_table(tensors, key)

    def copy() -> None:
        for (_, t), d in zip(tensors, targets, strict=True):
            d.copy_(t)

    def gather(hook=None) -> list[tuple[str, torch.Tensor]]:
        out = []
        for name, t in master:
            cast = t.to("cpu", torch.bfloat16, copy=True)
            if hook is not None:
                hook(cast)
            out.append((name, cast))
        return out

    def gather_digesting() -> None:
        with Digester(key) as digester:
            assert digester.table(gather(digester.add)) == table

    cases = {
        "copy": copy,
        "table": lambda: tensor_table(tensors, key),
        "verify": lambda: mismatches(tensors, table, key),
        "gather": gather,
        "gather_then_table": lambda: tensor_table(gather(), key),
        "gather_digesting": gather_digesting,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats + 1):
        for name, case in cases.items():
            t0 = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    result: dict[str, object] = {
        "size": args.size,
        "gb": round(nbytes / 1e9, 3),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_1min": float(open("/proc/loadavg").read().split()[0]),
    }
    for name, s in medians.items():
        result[f"{name}_s"] = round(s, 3)
    for name in ("copy", "table", "verify"):
        result[f"{name}_gbps"] = round(nbytes / medians[name] / 1e9, 2)
    result["table_over_copy"] = round(medians["table"] / medians["copy"], 2)
    result["verify_over_copy"] = round(medians["verify"] / medians["copy"], 2)
    result["export_digest_share_before"] = round(
        (medians["gather_then_table"] - medians["gather"]) / medians["gather"], 2
    )
    result["export_digest_share_now"] = round(
        (medians["gather_digesting"] - medians["gather"]) / medians["gather"], 2
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
