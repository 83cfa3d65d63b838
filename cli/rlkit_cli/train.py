"""`rlkit train CONFIG.toml [--section.field VALUE ...]`: the whole RL job from one config."""

from __future__ import annotations

import typer

from rlkit.launch.roles import Role
from rlkit.progress import make_console


def train(
    ctx: typer.Context,
    config: str = typer.Argument(..., help="TOML config (see examples/tiny-cpu/train.toml)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Check what --role needs, print the resolved config and exit."
    ),
    role: Role = typer.Option(Role.ALL, "--role", help="What this process runs."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in log.run_dir from its latest checkpoint."
    ),
    slurm: bool = typer.Option(
        False,
        "--slurm",
        help="Render a SLURM job for [slurm] into log.run_dir/slurm/ and submit it with sbatch "
        "(with --dry-run: print the script).",
    ),
) -> None:
    """Train a model with RL: vLLM servers, the async orchestrator and the FSDP2 trainer.

    Any config field can be overridden after the config path, e.g.
    `rlkit train cfg.toml --orchestrator.max_steps 20 --loss.name grpo`.
    """
    from rlkit.extras import require_train_extra

    require_train_extra("rlkit train")
    from rlkit.config import load_config
    from rlkit.launch.config import RLJobConfig, check_role
    from rlkit.launch.resume import interrupted_line, resumed_config

    err = make_console(stderr=True)
    if resume:  # the run's saved config; the overrides change it
        cfg, changes = resumed_config(config, list(ctx.args))
        for line in changes:
            err.print(line, markup=False, soft_wrap=True)
    else:
        cfg = load_config(RLJobConfig, config, list(ctx.args))
    if slurm:
        from rlkit.errors import UsageError
        from rlkit.launch.slurm import launch

        if role != Role.ALL:
            raise UsageError("--role: a --slurm job starts every role on its nodes; drop --role")
        # environments load on the head node when the job starts (their data may be there only)
        typer.echo(launch(cfg, resume=resume, dry_run=dry_run))
        return
    if dry_run:
        check_role(cfg, role)  # what this role loads and checks before it starts
        typer.echo(cfg.to_toml(), nl=False)  # loads back
        return
    from rlkit.launch import run_train

    try:
        result = run_train(cfg, role=role, resume=resume)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the launcher turns it into one)
        if role not in (Role.INFERENCE, Role.SANDBOX):  # a role that trains: say how to continue
            err.print(interrupted_line(cfg.log.run_dir), markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    evals = result.get("eval") or {}
    if len(evals) >= 2:
        first, last = min(evals), max(evals)
        console = make_console()
        for env_id in evals[last]:
            before = evals[first][env_id]["reward_mean"]
            after = evals[last][env_id]["reward_mean"]
            console.print(
                f"[bold]{env_id}[/]: eval reward {before:.3f} (step {first}) -> "
                f"{after:.3f} (step {last})"
            )
