"""`rlkit simulate CONFIG [--servers N] [--seed S] [--json] ...`: the schedulers of a training
config against a simulated cluster, in virtual time."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def simulate(
    ctx: typer.Context,
    config: str = typer.Argument(..., help="The `rlkit train` TOML config (its [simulate] too)."),
    servers: int | None = typer.Option(
        None, "--servers", help="Simulated servers (default: simulate.servers)."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Workload seed (default: orchestrator.seed)."
    ),
    steps: int | None = typer.Option(
        None, "--steps", help="Steps per scheduler (default: orchestrator.max_steps)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the plot (PNG) here."),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        help="Write each scheduler's records (batches, states, metrics) to RUN_DIR/<scheduler>/ "
        "for `rlkit runs audit`.",
    ),
    do_sweep: bool = typer.Option(
        False, "--sweep", help="Also sweep C3PO++'s Phi / Omega / sigma and name the best."
    ),
) -> None:
    """Simulate the config's schedulers on N servers in virtual time: step and rollout time,
    engine use, trainer idle, staleness, retention, purges, and speedups over sync.

    Config fields can be overridden after the path, as for `rlkit train`
    (e.g. `--simulate.at_cap 0.1 --orchestrator.schedulers.c3po.token_budget 65536`).
    """
    from rlkit.extras import require_train_extra

    require_train_extra("rlkit simulate")  # a training config loads the weight transports
    from rlkit.config import load_config
    from rlkit.errors import UsageError
    from rlkit.launch.config import RLJobConfig
    from rlkit.sim.compare import compare, sweep
    from rlkit.sim.compare import plot as draw
    from rlkit.sim.implied import implied_defaults

    cfg = load_config(RLJobConfig, config, list(ctx.args))
    implied = implied_defaults(cfg, cfg.simulate)  # what the config implies, unless [simulate] says
    sim = implied.sim
    n = servers if servers is not None else (sim.servers or cfg.inference.num_servers)
    if steps is not None and steps < 1:
        raise UsageError(f"--steps: need at least one step (got {steps})")
    if run_dir is not None and run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"--run-dir {run_dir} is not empty; choose a new directory")
    s = seed if seed is not None else cfg.orchestrator.seed
    result = compare(cfg, sim, servers=n, seed=s, steps=steps, run_dir=run_dir)
    if do_sweep:
        result["sweep"] = sweep(cfg, sim, servers=n, seed=s)
    if plot is not None:
        result["plot"] = str(draw(result, plot))
    result["defaults"] = implied.lines(n, "--servers" if servers is not None else None)
    if as_json:
        typer.echo(json.dumps({k: v for k, v in result.items() if k != "steps"}))
        return
    _print(result)


def _print(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from rlkit.progress import print_line
    from rlkit.sim.compare import (
        COLUMN_NOTES,
        LINE_NOTES,
        drop_lines,
        recommendation,
        table_lines,
    )

    console = Console()
    if not console.is_terminal:  # a pipe or a file: the whole table, unwrapped
        console = Console(width=200)
    w = result["workload"]
    console.print(
        f"{w['servers']} servers x {w['max_seqs']} sequences; "
        f"lengths: mean {w['mean_length']:.0f}, "
        f"{w['share_at_cap']:.1%} at the {w['length_cap']}-token cap; G={w['group_size']}, "
        f"sync {w['batch_groups']} groups, c3po Omega={w['capacity']} Phi={w['token_budget']} "
        f"sigma={w['retention']}; seed {w['seed']}"
    )
    console.print("where these figures come from:", markup=False)
    for line in result["defaults"]:
        print_line(console, line)
    header, *rows = table_lines(result)
    table = Table(*header)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for name, row in result["schedulers"].items():
        console.print(
            f"{name}: staleness {row['staleness']}, retention {row['retention']}, "
            f"prompts trained {row['prompts_trained']}, purged {row['prompts_purged']}, "
            f"dropped {row['prompts_dropped']}"
        )
    if "sweep" in result:
        best = result["sweep"]["best"]
        current = result["schedulers"].get("c3po", {}).get("trained_tokens_per_s")
        versus = (
            f" ({best['trained_tokens_per_s'] / current - 1:+.1%} over the current c3po setting)"
            if current
            else ""
        )
        console.print(
            f"sweep ({len(result['sweep']['rows'])} settings): best Phi={best['token_budget']} "
            f"({best['phi_x_batch']}x a sync batch), Omega={best['capacity']} "
            f"({best['omega_x_slots']}x the slots), sigma={best['retention']}: "
            f"{best['trained_tokens_per_s']:.0f} trained tokens/s{versus}, staleness "
            f"{best['staleness_mean']:.2f}"
        )
    if "plot" in result:
        console.print(f"plot: {result['plot']}")
    for label, note in {**COLUMN_NOTES, **LINE_NOTES}.items():
        print_line(console, f"{label}: {note}")
    for line in drop_lines(result):
        print_line(console, line)
    print_line(console, recommendation(result))
