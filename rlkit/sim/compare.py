"""`rlkit simulate`: every scheduler on one simulated workload, a table, a plot, a sweep.

`compare` runs each scheduler (`simulate.schedulers`, plus `orchestrator.scheduler`) for the
same steps on the same cluster and the same lengths and reports, per scheduler, the summary of
`rlkit.sim.run` plus its speedups over `sync` (rollout phase and end to end). `sweep` runs
C3PO++ over a grid of Phi / Omega / sigma and names the setting that trains the most tokens per
second of the run, among the settings whose mean staleness stays within
`orchestrator.max_off_policy_steps`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from rlkit.errors import UsageError
from rlkit.orchestrator.config import RolloutJobConfig
from rlkit.orchestrator.scheduler import scheduler_class
from rlkit.sim.config import SimConfig
from rlkit.sim.run import RunResult, Workload, length_cap, simulate_run, token_unit
from rlkit.sim.workload import lengths_for

# The simulator compares the built-in schedulers: each run against the synchronous baseline,
# and `--sweep` explores C3PO++'s parameters (Phi, Omega, sigma).
BASELINE = "sync"
SWEPT = "c3po"

TABLE_FIELDS = (
    ("step_s", "step s", "{:.1f}"),
    ("rollout_s", "rollout s", "{:.1f}"),
    ("speedup_step", "step x", "{:.2f}"),
    ("speedup_rollout", "rollout x", "{:.2f}"),
    ("engine_busy", "engine busy", "{:.0%}"),
    ("engine_occupancy", "slots used", "{:.0%}"),
    ("trainer_idle", "trainer idle", "{:.0%}"),
    ("staleness_mean", "staleness", "{:.2f}"),
    ("retention_mean", "retention", "{:.2f}"),
    ("rollouts_purged", "purged", "{}"),
    ("trained_tokens_per_s", "trained tok/s", "{:.0f}"),
)


def workload(cfg: RolloutJobConfig, sim: SimConfig, servers: int, seed: int) -> Workload:
    cap = length_cap(cfg, sim)
    return Workload(servers, lengths_for(sim, cap), token_unit(sim, cap), seed)


def check(cfg: RolloutJobConfig, sim: SimConfig, servers: int) -> None:
    """What the simulation needs beyond what the config's own validation checks."""
    if servers < 1:
        raise UsageError(f"--servers: need at least one server (got {servers})")
    for name in schedulers(cfg, sim):
        try:
            scheduler_class(name)
        except ValueError as exc:
            raise UsageError(f"simulate.schedulers: {exc}") from None


def schedulers(cfg: RolloutJobConfig, sim: SimConfig) -> list[str]:
    names = list(dict.fromkeys(sim.schedulers))
    if cfg.orchestrator.scheduler not in names:
        names.append(cfg.orchestrator.scheduler)
    return names


def compare(
    cfg: RolloutJobConfig,
    sim: SimConfig,
    *,
    servers: int,
    seed: int,
    steps: int | None = None,
    run_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Every scheduler on one workload; with `run_dir`, each leaves its records in
    `run_dir/<scheduler>/` (the layout of a real run)."""
    check(cfg, sim, servers)
    work = workload(cfg, sim, servers, seed)
    runs: dict[str, RunResult] = {}
    for name in schedulers(cfg, sim):
        where = Path(run_dir) / name.replace(":", "_").replace("/", "_") if run_dir else None
        runs[name] = simulate_run(cfg, sim, work, name, steps=steps, run_dir=where)
    base = runs.get(BASELINE)
    table = {}
    for name, run in runs.items():
        row = dict(run.summary)
        if base is not None:
            row["speedup_step"] = base.summary["step_s"] / row["step_s"]
            row["speedup_rollout"] = base.summary["rollout_s"] / row["rollout_s"]
        table[name] = row
    o = cfg.orchestrator
    sync, c3po = o.params_for(BASELINE).model_dump(), o.params_for(SWEPT).model_dump()
    return {
        "workload": {
            "servers": servers,
            "seed": seed,
            "max_seqs": sim.max_seqs,
            "group_size": o.group_size,
            "batch_groups": sync["batch_groups"],
            "capacity": c3po["capacity"],
            "token_budget": c3po["token_budget"],
            "retention": c3po["retention"],
            "length_cap": work.lengths.cap,
            "mean_length": work.lengths.mean(),
            "share_at_cap": work.lengths.share_at_cap(),
            "token_unit": work.token_unit,
        },
        "schedulers": table,
        "steps": {name: run.steps for name, run in runs.items()},
    }


def sweep(cfg: RolloutJobConfig, sim: SimConfig, *, servers: int, seed: int) -> dict[str, Any]:
    """C3PO++ over Phi x Omega x sigma (multiples from `simulate.sweep_*`); the best setting."""
    check(cfg, sim, servers)
    work = workload(cfg, sim, servers, seed)
    o = cfg.orchestrator
    batch_groups = o.params_for(BASELINE).model_dump()["batch_groups"]
    batch_tokens = batch_groups * o.group_size * work.lengths.mean()
    slots = servers * sim.max_seqs
    rows = []
    for phi, omega, sigma in itertools.product(sim.sweep_phi, sim.sweep_omega, sim.sweep_sigma):
        setting = {
            "token_budget": max(work.lengths.cap, round(phi * batch_tokens)),
            "capacity": max(o.group_size, round(omega * slots)),
            "retention": sigma,
        }
        change = {"scheduler": SWEPT, "schedulers": {SWEPT: setting}}
        run = simulate_run(cfg, sim, work, SWEPT, steps=sim.sweep_steps, orchestrator=change)
        s = run.summary
        rows.append(
            {
                **setting,
                "phi_x_batch": phi,
                "omega_x_slots": omega,
                "trained_tokens_per_s": s["trained_tokens_per_s"],
                "step_s": s["step_s"],
                "staleness_mean": s["staleness_mean"],
                "rollouts_purged": s["rollouts_purged"],
                "wasted_tokens": s["wasted_tokens"],
            }
        )
    fit = [r for r in rows if r["staleness_mean"] <= o.max_off_policy_steps] or rows
    best = max(fit, key=lambda r: (r["trained_tokens_per_s"], -r["staleness_mean"]))
    return {"rows": rows, "best": best, "staleness_limit": o.max_off_policy_steps}


def table_lines(result: dict[str, Any]) -> list[list[str]]:
    """Header and one row per scheduler, formatted."""
    rows = [["scheduler", *(label for _, label, _ in TABLE_FIELDS)]]
    for name, row in result["schedulers"].items():
        cells = [name]
        for key, _, fmt in TABLE_FIELDS:
            cells.append(fmt.format(row[key]) if key in row else "-")
        rows.append(cells)
    return rows


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Step time per step, and the staleness and retention distributions, per scheduler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, steps in result["steps"].items():
        axes[0].plot([r["step"] for r in steps], [r["step_time_s"] for r in steps], label=name)
    axes[0].set(xlabel="step", ylabel="step time (simulated s)", title="step time")
    axes[0].legend()
    width = 0.8 / max(len(result["schedulers"]), 1)
    for i, (name, row) in enumerate(result["schedulers"].items()):
        for ax, key in ((axes[1], "staleness"), (axes[2], "retention")):
            hist = {int(k): v for k, v in row[key].items()}
            total = sum(hist.values()) or 1
            ax.bar(
                [k - 0.4 + (i + 0.5) * width for k in hist],
                [v / total for v in hist.values()],
                width,
                label=name,
            )
    axes[1].set(xlabel="staleness (policy versions)", ylabel="share of samples", title="staleness")
    axes[2].set(xlabel="retention (updates spanned)", ylabel="share of groups", title="retention")
    w = result["workload"]
    fig.suptitle(
        f"{w['servers']} servers, mean length {w['mean_length']:.0f}, "
        f"{w['share_at_cap']:.0%} at the {w['length_cap']} cap"
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


COLUMN_NOTES = {
    "step s": "simulated seconds per training step",
    "rollout s": "of those, seconds waiting for the batch's rollouts",
    "step x": "sync's step time / this scheduler's (above 1: faster)",
    "rollout x": "the same for the rollout wait",
    "engine busy": "share of time the inference servers generate",
    "slots used": "share of the servers' sequence slots in use",
    "trainer idle": "share of time the trainer waits for a batch",
    "staleness": "mean policy versions a trained sample lags the trainer",
    "retention": "mean policy updates a rollout spans while generating",
    "purged": "rollouts dropped for spanning more than sigma updates",
    "trained tok/s": "trained tokens per simulated second: the figure to maximise",
}
# the per-scheduler line under the table
LINE_NOTES = {
    "staleness {v: n}": "n trained samples were v policy versions behind the trainer",
    "retention {u: n}": "n trained prompts' rollouts spanned u policy updates while generating",
    "prompts trained / purged / dropped": "prompts that gave samples to a step / whose "
    "rollouts were purged / that gave no sample, by reason (below)",
}
DROP_REASONS = {
    "no_samples": "every rollout of the prompt was filtered out (equal rewards under "
    "drop_zero_advantage, too stale, or errored): the prompt gave no sample",
    "purged": "its rollouts stayed in flight past sigma policy updates (C3PO++ retention)",
}


def drop_lines(result: dict[str, Any]) -> list[str]:
    """What each drop reason the table's rows name means."""
    reasons = {r for row in result["schedulers"].values() for r in row.get("prompts_dropped", {})}
    return [
        f"dropped {r}: {DROP_REASONS.get(r, 'see rlkit.orchestrator')}" for r in sorted(reasons)
    ]


def recommendation(result: dict[str, Any]) -> str:
    """One plain line: which scheduler to set, its gain in trained tokens/s over sync, and how
    far one simulated seed can be trusted."""
    rows = result["schedulers"]
    best_name = max(rows, key=lambda n: rows[n]["trained_tokens_per_s"])
    base = rows.get(BASELINE)
    sure = "one simulated seed: rerun with --seed N to see the spread"
    if base is None or best_name == BASELINE or not base["trained_tokens_per_s"]:
        return f'recommendation: keep orchestrator.scheduler = "{best_name}" ({sure})'
    best = rows[best_name]
    gain = best["trained_tokens_per_s"] / base["trained_tokens_per_s"] - 1
    setting = f'orchestrator.scheduler = "{best_name}"'
    sweep_best = result.get("sweep", {}).get("best")
    if sweep_best and best_name == SWEPT:
        setting += (
            f" with token_budget = {sweep_best['token_budget']}, capacity = "
            f"{sweep_best['capacity']}, retention = {sweep_best['retention']}"
        )
        gain = max(gain, sweep_best["trained_tokens_per_s"] / base["trained_tokens_per_s"] - 1)
    if gain < 0.05:
        return (
            f"recommendation: keep sync: {best_name} trains only {gain:+.1%} more tokens/s, "
            f"within what {sure.split(':')[0]} can tell"
        )
    return (
        f"recommendation: set {setting}: {gain:+.1%} trained tokens/s over sync, staleness "
        f"{best['staleness_mean']:.2f} ({sure})"
    )
