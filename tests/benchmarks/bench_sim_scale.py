"""C3PO++ over sync at cluster scale, in simulated time (`rlkit.sim`): the speedup curves.

Three parts, each the real schedulers against the simulated server pool:
- `tail`: rollout-phase and end-to-end speedup of c3po over sync against the share of
  completions at the cap (Ring-1T's long tail), at a fixed cluster;
- `servers`: the same against N (weak scaling: the batch and Omega grow with N, each server
  keeps `max_seqs` slots); Ring-1T's reported point (2.5x rollout, 1.5x step) is marked;
- `validate`: `bench_scheduler.py --engine vllm`'s workload (its lengths, one server, its
  trainer's step time) next to the real engine's recorded runs (docs/benchmarks.md).
And `cost`: CPU seconds of one big run (servers x steps), the simulator's own speed.

    python tests/benchmarks/bench_sim_scale.py [--parts tail,servers,validate,cost] [--out DIR]

Writes DIR/sim_scale.json and DIR/sim_scale.png; prints one JSON line (the curves' ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rlkit.orchestrator.config import RolloutJobConfig
from rlkit.sim.compare import compare
from rlkit.sim.config import SimConfig

RING_1T = {"rollout": 2.5, "step": 1.5}  # Ring-1T Figure 7: C3PO++ over its baseline
# bench_scheduler.py --engine vllm, Ring-1T command (docs/benchmarks.md): every recorded run
REAL_VLLM_RUNS = {
    "rollout": [1.38, 2.92, 1.12, 1.64, 1.68, 1.56, 2.81, 1.82, 2.15, 1.54],
    "step": [1.09, 1.64, 0.96, 1.18, 1.05, 1.14, 1.56, 0.93, 0.96, 0.94],
}


def cluster(servers: int, at_cap: float, steps: int, max_seqs: int, seed: int) -> dict[str, Any]:
    """A Ring-1T-like workload: 64k cap, median 4k, G = 8; the sync batch fills every slot
    once (N x max_seqs rollouts, max_seqs / G groups a server), c3po keeps as many in flight
    with Phi = that batch's expected tokens and sigma = 2; the trainer step takes ~0.8x sync's
    rollout phase at 5% at the cap, as in Ring-1T's reported ratios (2.5x / 1.5x)."""
    g = 8
    groups = max(1, servers * max_seqs // g)
    sim = SimConfig(
        max_seqs=max_seqs,
        tick_base_s=0.02,
        tick_per_seq_s=1e-3,
        median=4000.0,
        sigma=0.8,
        at_cap=at_cap,
        max_tokens=65536,
        update_s=10.0,
        train_base_s=30.0,
        train_per_token_s=0.0,
        token_unit=1024,
        dataset_size=max(10_000, groups * (steps + 4) * 2),
    )
    mean = _mean_length(sim)
    budget = int(groups * g * mean)
    # trainer: 30 s + ~1,900 s for the batch (sync's rollout phase at 5% at the cap: ~2,400 s)
    sim = sim.model_copy(update={"train_per_token_s": 1900.0 / budget})
    cfg = RolloutJobConfig.model_validate(
        {
            "env": [{"id": "sim"}],
            "orchestrator": {
                "max_steps": steps,
                "group_size": g,
                "schedulers": {
                    "sync": {"batch_groups": groups},
                    "c3po": {
                        "capacity": groups * g,
                        "token_budget": budget,
                        "retention": 2,
                    },
                },
                "max_off_policy_steps": 8,
            },
        }
    )
    return _row(compare(cfg, sim, servers=servers, seed=seed))


def _mean_length(sim: SimConfig) -> float:
    from rlkit.sim.workload import lengths_for

    return lengths_for(sim, sim.max_tokens).mean()


def _row(result: dict[str, Any]) -> dict[str, Any]:
    s, c = result["schedulers"]["sync"], result["schedulers"]["c3po"]
    return {
        "servers": result["workload"]["servers"],
        "share_at_cap": result["workload"]["share_at_cap"],
        "rollout_speedup": c["speedup_rollout"],
        "step_speedup": c["speedup_step"],
        "sync": _brief(s),
        "c3po": _brief(c),
    }


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "step_s",
        "rollout_s",
        "weight_update_s",
        "engine_busy",
        "engine_occupancy",
        "trainer_idle",
        "staleness_mean",
        "retention_mean",
        "rollouts_purged",
        "wasted_tokens",
    )
    return {k: row[k] for k in keys}


# The real engine as bench_vllm_decode.py measured it (fixed-length bursts and weight updates
# on the tiny model bench_scheduler serves, not bench_scheduler's workload: nothing here is
# fitted to the speedup it is compared with). Command and load: docs/benchmarks.md.
MEASURED_ENGINE: dict[str, Any] | None = {
    "label": "measured (bench_vllm_decode.py, session 16)",
    "tick_base_s": 3.963e-3,
    "tick_per_seq_s": 2.760e-4,
    "update_s": 9.933e-2,
    "update_per_seq_s": 3.504e-5,
}
# What the speedup hangs on, for comparison: the decode step's cost per running sequence (how
# much more a server yields with more sequences), with the update seen in bench_scheduler's runs
SENSITIVITY_ENGINES = [
    {"label": label, "tick_base_s": base, "tick_per_seq_s": per_seq, "update_s": 0.026,
     "update_per_seq_s": 1e-3}
    for label, base, per_seq in (
        ("2 ms + 100 us/seq", 2e-3, 1e-4),
        ("3 ms + 20 us/seq (bench_scheduler's sim engine)", 3e-3, 2e-5),
        ("1.5 ms + 200 us/seq", 1.5e-3, 2e-4),
    )
]  # fmt: skip


def validate(seeds: int, engines: list[dict[str, Any]]) -> dict[str, Any]:
    """bench_scheduler.py --engine vllm --median 30 --sigma 0.5 --at-cap 0.1 --max-tokens 512
    --capacity-factor 2 --retention 8 --steps 8: one server, G = 8, 8 groups per sync batch,
    trainer 0.2 s + 2e-5 s per token (bench_scheduler's own sleep, exact), on each engine of
    `engines` (the measured one first), `seeds` seeds each."""
    real = REAL_VLLM_RUNS
    out: dict[str, Any] = {"real_rollout": real["rollout"], "real_step": real["step"]}
    out["engines"] = []
    for engine in engines:
        sim = SimConfig(
            max_seqs=128,
            tick_base_s=engine["tick_base_s"],
            tick_per_seq_s=engine["tick_per_seq_s"],
            prompt_tokens=4,
            prefill_per_token_s=0.0,
            update_s=engine["update_s"],
            update_per_seq_s=engine["update_per_seq_s"],
            train_base_s=0.2,
            train_per_token_s=2e-5,
            median=30.0,
            sigma=0.5,
            at_cap=0.1,
            max_tokens=512,
            token_unit=1,
            dataset_size=10_000,
        )
        mean = _mean_length(sim)
        cfg = RolloutJobConfig.model_validate(
            {
                "env": [{"id": "bench"}],
                "orchestrator": {
                    "max_steps": 8,
                    "group_size": 8,
                    "schedulers": {
                        "sync": {"batch_groups": 8},
                        "c3po": {
                            "capacity": 128,
                            "token_budget": int(8 * 8 * mean),
                            "retention": 8,
                        },
                    },
                    "max_off_policy_steps": 10**6,
                },
            }
        )
        rows = [_row(compare(cfg, sim, servers=1, seed=seed)) for seed in range(seeds)]
        sim_r = [r["rollout_speedup"] for r in rows]
        sim_s = [r["step_speedup"] for r in rows]
        out["engines"].append(
            {
                **engine,
                "sync_rollout_s": statistics.fmean(r["sync"]["rollout_s"] for r in rows),
                "sync_step_s": statistics.fmean(r["sync"]["step_s"] for r in rows),
                "c3po_weight_update_s": statistics.fmean(
                    r["c3po"]["weight_update_s"] for r in rows
                ),
                "sim_rollout": sim_r,
                "sim_step": sim_s,
                "sim_rollout_mean": statistics.fmean(sim_r),
                "sim_step_mean": statistics.fmean(sim_s),
                "rollout_within_real_spread": min(real["rollout"])
                <= statistics.fmean(sim_r)
                <= max(real["rollout"]),
                "step_within_real_spread": min(real["step"])
                <= statistics.fmean(sim_s)
                <= max(real["step"]),
            }
        )
    return out


def cost(servers: int, steps: int, groups: int) -> dict[str, Any]:
    """CPU seconds of one c3po run of `steps` steps on `servers` servers."""
    sim = SimConfig(
        max_seqs=16,
        median=4000.0,
        sigma=0.8,
        at_cap=0.05,
        max_tokens=65536,
        token_unit=1024,
        train_per_token_s=1e-5,
        dataset_size=groups * steps * 3,
    )
    cfg = RolloutJobConfig.model_validate(
        {
            "env": [{"id": "sim"}],
            "orchestrator": {
                "max_steps": steps,
                "group_size": 8,
                "schedulers": {
                    "sync": {"batch_groups": groups},
                    "c3po": {
                        "capacity": groups * 8,
                        "token_budget": int(groups * 8 * _mean_length(sim)),
                        "retention": 2,
                    },
                },
                "max_off_policy_steps": 8,
            },
        }
    )
    sim = sim.model_copy(update={"schedulers": ["c3po"]})
    t0, c0 = time.perf_counter(), time.process_time()
    result = compare(cfg, sim, servers=servers, seed=0)
    c3po = result["schedulers"]["c3po"]
    cpu = time.process_time() - c0
    rollouts = c3po["prompts_trained"] * 8
    return {
        "servers": servers,
        "steps": steps,
        "rollouts_per_step": groups * 8,
        "cpu_s": cpu,
        "wall_s": time.perf_counter() - t0,
        "cpu_us_per_trained_rollout": 1e6 * cpu / max(rollouts, 1),
        "simulated_hours": c3po["simulated_s"] / 3600,
    }


def _engine_from(path: Path) -> dict[str, Any]:
    """The engine parameters of a bench_vllm_decode.py result."""
    m = json.loads(path.read_text().strip().splitlines()[-1])
    return {
        "label": f"measured ({path.name})",
        "tick_base_s": m["tick_base_s"],
        "tick_per_seq_s": m["tick_per_seq_s"],
        "update_s": max(0.0, m["update_base_s"]),
        "update_per_seq_s": max(0.0, m["update_per_seq_s"]),
    }


def draw(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    parts = [
        ("tail", "share_at_cap", "share of completions at the cap"),
        ("servers", "servers", "servers N"),
    ]
    for ax, (part, key, label) in zip(axes, parts, strict=False):
        rows = out.get(part) or []
        if not rows:
            ax.set_visible(False)
            continue
        xs = [r[key] for r in rows]
        ax.plot(xs, [r["rollout_speedup"] for r in rows], "o-", label="rlkit c3po: rollout phase")
        ax.plot(xs, [r["step_speedup"] for r in rows], "s-", label="rlkit c3po: end to end")
        ax.axhline(RING_1T["rollout"], color="C0", ls=":", label="Ring-1T rollout 2.5x")
        ax.axhline(RING_1T["step"], color="C1", ls=":", label="Ring-1T step 1.5x")
        ax.axhline(1.0, color="grey", lw=0.5)
        if part == "servers":
            ax.set_xscale("log", base=2)
        ax.set(xlabel=label, ylabel="speedup over sync", title=f"c3po / sync vs {label}")
        ax.legend(fontsize=8)
    v = out.get("validate")
    ax = axes[2]
    if v:
        real = REAL_VLLM_RUNS
        ax.scatter([0] * len(real["rollout"]), real["rollout"], label="real vLLM CPU runs", c="k")
        ax.scatter([1] * len(real["step"]), real["step"], c="k")
        for i, e in enumerate(v["engines"]):
            dx = 0.12 * (i + 1)
            label = f"sim, {e['label']}"
            ax.scatter([dx] * len(e["sim_rollout"]), e["sim_rollout"], c=f"C{i}", label=label)
            ax.scatter([1 + dx] * len(e["sim_step"]), e["sim_step"], c=f"C{i}")
        ax.set_xticks([0.2, 1.2], ["rollout phase", "end to end"])
        ax.set(ylabel="speedup over sync", title="bench_scheduler workload: sim vs real")
        ax.legend(fontsize=7)
    else:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", default="tail,servers,validate,cost")
    p.add_argument("--out", type=Path, default=Path("sim-scale"))
    p.add_argument("--steps", type=int, default=8, help="steps per scheduler in tail/servers")
    p.add_argument("--tail-servers", type=int, default=64)
    p.add_argument("--at-cap", default="0,0.02,0.05,0.1,0.2")
    p.add_argument("--servers", default="8,32,128,512,1024")
    p.add_argument("--max-seqs", type=int, default=16, help="slots per server in tail/servers")
    p.add_argument("--seeds", type=int, default=5, help="validate: seeds")
    p.add_argument(
        "--engine-json",
        type=Path,
        help="validate: bench_vllm_decode.py's JSON line (default: the recorded figures)",
    )
    p.add_argument("--cost", default="1024,1000,128", help="cost: servers,steps,groups of 8")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    parts = set(args.parts.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"benchmark": "sim_scale_c3po_vs_sync", "ring_1t": RING_1T}
    if "tail" in parts:
        out["tail"] = [
            cluster(args.tail_servers, float(a), args.steps, args.max_seqs, args.seed)
            for a in args.at_cap.split(",")
        ]
    if "servers" in parts:
        out["servers"] = [
            cluster(int(n), 0.05, args.steps, args.max_seqs, args.seed)
            for n in args.servers.split(",")
        ]
    if "validate" in parts:
        measured = _engine_from(args.engine_json) if args.engine_json else MEASURED_ENGINE
        engines = [measured] if measured else []
        out["validate"] = validate(args.seeds, [*engines, *SENSITIVITY_ENGINES])
    if "cost" in parts:
        servers, steps, groups = (int(x) for x in args.cost.split(","))
        out["cost"] = cost(servers, steps, groups)
    (args.out / "sim_scale.json").write_text(json.dumps(out, indent=1))
    draw(out, args.out / "sim_scale.png")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
