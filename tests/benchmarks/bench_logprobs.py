"""Chunked versus naive logprobs (forward + backward): peak memory and time, same run.

Each variant runs in a fresh subprocess so its peak RSS (getrusage maxrss of the child) is its
own. Default shape: 8,192 tokens, hidden 1,024, vocabulary 151,936 (Qwen), fp32 on CPU. The
naive variant's [N, V] fp32 logits are ~5 GB and its backward holds about three such blocks, so
it needs ~17 GB free; pass smaller --tokens on a smaller machine.

    python tests/benchmarks/bench_logprobs.py [--tokens 8192] [--vocab 151936] [--hidden 1024]

Prints one JSON line: each variant's peak RSS and time, and the naive/chunked ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from rlkit.trainer.logprobs import chunked_logprobs, naive_logprobs


def run_variant(variant: str, tokens: int, vocab: int, hidden: int, chunk_size: int) -> None:
    """Child process: one forward + backward; prints seconds, own peak RSS and a checksum."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=gen).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * hidden**-0.5).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    start = time.perf_counter()
    if variant == "naive":
        logprobs, _ = naive_logprobs(h, w, targets)
    else:
        logprobs, _ = chunked_logprobs(h, w, targets, chunk_size=chunk_size)
    logprobs.sum().backward()
    seconds = time.perf_counter() - start
    checksum = float(logprobs.detach().sum()) + float(h.grad.sum()) + float(w.grad.abs().sum())
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(json.dumps({"seconds": seconds, "peak_rss_gib": peak_gib, "checksum": checksum}))


def measure(variant: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one variant in a fresh interpreter so its peak RSS is its own."""
    command = [sys.executable, __file__, "--child", variant]
    command += ["--tokens", str(args.tokens), "--vocab", str(args.vocab)]
    command += ["--hidden", str(args.hidden), "--chunk-size", str(args.chunk_size)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{variant} variant failed (rc {result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--child", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_variant(args.child, args.tokens, args.vocab, args.hidden, args.chunk_size)
        return
    chunked = measure("chunked", args)
    naive = measure("naive", args)
    same = abs(chunked["checksum"] - naive["checksum"]) <= 1e-3 * abs(naive["checksum"])
    print(
        json.dumps(
            {
                "bench": "logprobs",
                "tokens": args.tokens,
                "vocab": args.vocab,
                "hidden": args.hidden,
                "chunk_size": args.chunk_size,
                "threads": torch.get_num_threads(),
                "chunked_peak_rss_gib": round(chunked["peak_rss_gib"], 3),
                "naive_peak_rss_gib": round(naive["peak_rss_gib"], 3),
                "chunked_seconds": round(chunked["seconds"], 2),
                "naive_seconds": round(naive["seconds"], 2),
                "peak_memory_ratio_naive_over_chunked": round(
                    naive["peak_rss_gib"] / chunked["peak_rss_gib"], 2
                ),
                "time_ratio_chunked_over_naive": round(chunked["seconds"] / naive["seconds"], 2),
                "results_match": same,
            }
        )
    )


if __name__ == "__main__":
    main()
