"""The tensor table's tags (`rlkit.protocol.weights`: one-time Poly1305 per tensor) against a
plain copy of the same bytes, in one process, at a real model's shapes (issue 63: "the check
<= 1.5x a plain copy"), with keyed BLAKE3 (the digest before) for reference.

    python tests/benchmarks/bench_digest.py [--size qwen3-0.6b] [--repeats 5] [--torch-threads N]

Builds random bf16 tensors at `--size`'s shapes (`rlkit.models.shapes`: qwen3-0.6b is 1.19 GB,
tied embeddings) and times, interleaved `--repeats` times (the first round warms up):

- `copy_s`: every tensor copied into a preallocated one of its shape (the bytes read once and
  written once: the floor of any step that moves them), the faster of torch's threads and one
  thread (`copy_threads_s`, `copy_one_thread_s`), as `bench_weight_update.py` times it;
- `table_s`: the trainer's tensor table (`PublishedVersion.build`: a fresh nonce, one Poly1305
  tag per tensor under its one-time key, OpenSSL's without the GIL on a thread per core);
- `verify_s`: a worker's check of received tensors against it (`mismatches`);
  `verify_one_thread_s` the same with the `cryptography` package's Poly1305 (the fallback,
  which holds the GIL: one thread);
- `blake3_s` / `blake3_threads_s`: keyed BLAKE3 of every tensor on one thread / on BLAKE3's own
  threads for tensors of 4 MiB or more (what the table held before), if `blake3` is installed;
- the trainer's export as `rlkit.trainer.export` runs it on the exporting rank: each fp32 tensor
  cast into a new bf16 CPU tensor one at a time (`gather_s`, the gather of a single rank), then
  the table after the gather (`gather_then_table_s`) or each tensor handed to the `Digester` as
  soon as it is cast (`gather_digesting_s`, the export now).

Prints one JSON line: medians, GB/s and the ratios to the copy (`check_over_copy`: the worker's
check, the issue's bar), with the 1-minute load average. Runs with `OMP_WAIT_POLICY=PASSIVE`
unless it is set (as rlkit runs its CPU trainer and engines: with OpenMP's default spinning on a
loaded 2-core machine, torch's two threads made the copy 5-20x slower than one).
`--torch-threads` (default: torch's own) sets torch's intra-op threads, which the copies and
casts use.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from rlkit.models.shapes import REAL_SHAPES
from rlkit.protocol.credentials import digest_key, new_token
from rlkit.protocol.weights import (
    Digester,
    PublishedVersion,
    mismatches,
    openssl_poly1305,
    tensor_bytes,
)


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
    if "OMP_WAIT_POLICY" not in os.environ:  # as rlkit runs a CPU trainer and engine
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # read when OpenMP starts: start again
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    g = torch.Generator().manual_seed(0)
    master = [(n, torch.randn(s, generator=g) * 0.02) for n, s in qwen3_shapes(args.size)]
    tensors = [(n, t.bfloat16()) for n, t in master]
    targets = [torch.zeros_like(t) for _, t in tensors]
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    key = digest_key(new_token())
    record = PublishedVersion.build(1, "ipc", tensors, key)

    def copy() -> None:
        for (_, t), d in zip(tensors, targets, strict=True):
            d.copy_(t)

    def copy_one_thread() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        copy()
        torch.set_num_threads(threads)

    def gather(hook=None) -> list[tuple[str, torch.Tensor]]:
        out = []
        for name, t in master:
            cast = t.to("cpu", torch.bfloat16, copy=True)
            if hook is not None:
                hook(cast, name)
            out.append((name, cast))
        return out

    def gather_digesting() -> None:
        with Digester(key, record.nonce) as digester:
            assert digester.table(gather(digester.add)) == record.tensors

    def gather_then_table() -> None:
        with Digester(key, record.nonce) as digester:
            assert digester.table(gather()) == record.tensors

    def verify() -> None:
        assert mismatches(tensors, record, key) == []

    def verify_one_thread() -> None:
        os.environ["RLKIT_POLY1305"] = "cryptography"
        openssl_poly1305.cache_clear()
        try:
            verify()
        finally:
            del os.environ["RLKIT_POLY1305"]
            openssl_poly1305.cache_clear()

    cases = {
        "copy_threads": copy,
        "copy_one_thread": copy_one_thread,
        "table": lambda: PublishedVersion.build(1, "ipc", tensors, key),
        "verify": verify,
        "verify_one_thread": verify_one_thread,
        "gather": gather,
        "gather_then_table": gather_then_table,
        "gather_digesting": gather_digesting,
    }
    try:
        from blake3 import blake3

        def blake3_all(threads: bool) -> None:
            for _, t in tensors:
                raw = tensor_bytes(t)
                n = blake3.AUTO if threads and raw.nbytes >= 4 << 20 else 1
                blake3(raw, key=key, max_threads=n).digest()

        cases["blake3"] = lambda: blake3_all(False)
        cases["blake3_threads"] = lambda: blake3_all(True)
    except ImportError:
        pass
    load_before = float(open("/proc/loadavg").read().split()[0])
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats + 1):
        for name, case in cases.items():
            t0 = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    medians["copy"] = min(medians["copy_threads"], medians["copy_one_thread"])
    result: dict[str, object] = {
        "size": args.size,
        "gb": round(nbytes / 1e9, 3),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "tag_threads": Digester(key).threads,
        "load_1min_before": load_before,
    }
    for name, s in medians.items():
        result[f"{name}_s"] = round(s, 3)
    checks = ("table", "verify", "verify_one_thread", "blake3", "blake3_threads")
    for name in ("copy", *checks):
        if name in medians:
            result[f"{name}_gbps"] = round(nbytes / medians[name] / 1e9, 2)
    for name in checks:
        if name in medians:
            result[f"{name}_over_copy"] = round(medians[name] / medians["copy"], 2)
    result["check_over_copy"] = result["verify_over_copy"]  # issue 63's bar: <= 1.5
    result["export_tag_share_after_gather"] = round(
        (medians["gather_then_table"] - medians["gather"]) / medians["gather"], 2
    )
    result["export_tag_share_digesting"] = round(
        (medians["gather_digesting"] - medians["gather"]) / medians["gather"], 2
    )
    result["load_1min_after"] = float(open("/proc/loadavg").read().split()[0])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
