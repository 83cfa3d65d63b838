"""How far apart the logprob canary puts right and wrong weight updates, on a trained policy.

The canary (`rlkit.inference.canary`) compares the trainer's logprobs of a fixed token sequence,
written into each published version's record, with the engine's after the update, as a k3 KL;
the run stops above `inference.canary_max_kl`. The threshold must sit above the engine's numeric
floor (bf16 kernels against the fp32 trainer) and below what a wrong update scores. This script
reads a run's published versions (by default the CPU demo's: run `bash scripts/demo.sh` first) and
prints, side by side:

- the engine's floor: `weights_canary_kl` over the run's steps (its metrics.jsonl),
- the same weights through transformers in fp32 and in bf16 (no engine),
- wrong updates of the last version through transformers in fp32: the last layer a stale copy
  of the one before, the first two layers swapped (the same bytes under each other's
  names: what the tensor table cannot see), and the run's first version served instead (an
  update that never arrived),

and each one's ratio to the threshold. Each row shows the canary's statistic, the median of the
tokens' k3, beside their mean (the statistic before: one token bf16 moves can push it over).
`--version` scores another published version than the last (e.g. the one a run stopped on).

    python tests/benchmarks/bench_canary.py [--run runs/tiny-cpu/rl] [--version step_000017]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from rlkit.inference.canary import canary_kl
from rlkit.orchestrator.config import InferenceConfig
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.weights import Canary, PublishedVersion


def canary_logprobs(model: torch.nn.Module, token_ids: list[int]) -> list[float]:
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


def canary_of(directory: Path) -> Canary | None:
    """The trainer's canary of a published version (None: no record, or no canary)."""
    return Canary.read(directory) if PublishedVersion.read(directory) is not None else None


def swap_layers(layers: torch.nn.ModuleList, a: int, b: int) -> None:
    first = {k: v.clone() for k, v in layers[a].state_dict().items()}
    layers[a].load_state_dict(layers[b].state_dict())
    layers[b].load_state_dict(first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/tiny-cpu/rl"))
    parser.add_argument("--version", default=None, help="a published version (default: last)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    layout = RunLayout(args.run)
    versions = sorted(p for p in layout.weights.glob("step_*") if canary_of(p) is not None)
    if not versions:
        raise SystemExit(f"{args.run}: no published version with a canary (run the demo first)")
    last = versions[-1] if args.version is None else layout.weights / args.version
    canary = canary_of(last)
    assert canary is not None
    ids, trainer = canary.token_ids, canary.logprobs
    limit = InferenceConfig.model_fields["canary_max_kl"].default

    engine = [
        r["weights_canary_kl"]
        for r in map(json.loads, layout.metrics.read_text().splitlines())
        if r.get("weights_canary_kl") is not None
    ]
    print(
        f"run {args.run}: {len(engine)} updates, the engine's weights_canary_kl (as the run "
        f"computed it) max {max(engine):.3g}, median {statistics.median(engine):.3g}"
    )
    scored: dict[str, list[float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(last, dtype=dtype)
        scored[f"right_{str(dtype).split('.')[-1]}"] = canary_logprobs(model, ids)
    model = AutoModelForCausalLM.from_pretrained(last, dtype=torch.float32)
    layers = model.model.layers
    swap_layers(layers, 0, 1)
    scored["wrong_two_layers_swapped"] = canary_logprobs(model, ids)
    swap_layers(layers, 0, 1)
    layers[-1].load_state_dict(layers[-2].state_dict())
    scored["wrong_last_layer_stale"] = canary_logprobs(model, ids)
    if versions[0] != last:
        first = AutoModelForCausalLM.from_pretrained(versions[0], dtype=torch.float32)
        scored[f"wrong_{versions[0].name}_served"] = canary_logprobs(first, ids)

    print(f"version {last.name}, limit {limit}")
    rows = {name: canary_kl(trainer, engine_lp) for name, engine_lp in scored.items()}
    for name, engine_lp in scored.items():
        pairs = zip(trainer, engine_lp, strict=True)
        mean = statistics.fmean(canary_kl([t], [e]) for t, e in pairs)
        kl = rows[name]
        print(f"  {name:28s} KL {kl:10.3g} (mean {mean:9.3g})   {kl / limit:8.3g}x the limit")
    floor = max(rows["right_float32"], rows["right_bfloat16"], max(engine))
    wrong = min(v for k, v in rows.items() if k.startswith("wrong_"))
    print(
        f"margins: limit / largest right score {limit / floor:.3g}x, "
        f"mildest wrong / limit {wrong / limit:.3g}x"
    )


if __name__ == "__main__":
    main()
