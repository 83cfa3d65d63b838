"""`rlkit sft CONFIG.toml [--section.field VALUE ...]`: supervised fine-tuning on chat data."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from rlkit.progress import make_console


def sft(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="SFT config (TOML): model, data, optim, ckpt."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in run_dir from its latest checkpoint."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and exit."),
) -> None:
    """Cross-entropy on assistant tokens with the FSDP2 trainer; writes RUN_DIR/final as an HF
    model directory.

    Any config field can be overridden after the config path, e.g.
    `rlkit sft sft.toml --optim.lr 1e-4 --data.epochs 2 --nproc 2`.
    """
    from rlkit.extras import require_train_extra

    require_train_extra("rlkit sft")
    from rlkit.atomic import atomic_write
    from rlkit.config import dump_toml, load_config
    from rlkit.machine import has_cuda
    from rlkit.protocol.layout import RunLayout
    from rlkit.trainer.allocator import with_allocator
    from rlkit.trainer.config import SFTConfig
    from rlkit.trainer.main import run, trainer_command

    overrides = list(ctx.args)
    cfg = load_config(SFTConfig, config, overrides)  # validate before anything starts
    if dry_run:
        make_console().print(dump_toml(cfg), markup=False)
        return
    resume_arg = "latest" if resume and not cfg.ckpt.resume else None
    RunLayout(cfg.run_dir).create()
    env = with_allocator(dict(os.environ), cfg.allocator, has_cuda())
    # torchrun's ranks, or a process that starts with the allocator preloaded, read the
    # resolved config, as `rlkit train`'s trainer does
    if cfg.nproc > 1 or env != dict(os.environ):
        resolved = atomic_write(Path(cfg.run_dir) / "sft.toml", dump_toml(cfg))
        argv = trainer_command(resolved, cfg.nproc, mode="sft", resume=resume_arg)
        os.execve(argv[0], argv, env)
    run("sft", str(config), overrides, resume_arg)
