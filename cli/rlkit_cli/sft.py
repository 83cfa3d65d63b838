"""`rlkit sft CONFIG.toml`: supervised fine-tuning on chat data with the FSDP2 trainer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from rlkit.errors import UsageError


def sft(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="SFT config (TOML): model, data, optim, ckpt."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint."),
    resume_from: str = typer.Option("", help="Continue from this checkpoint directory."),
    nproc: int = typer.Option(1, help="Ranks on this machine (runs under torchrun when > 1)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and exit."),
) -> None:
    """Cross-entropy on assistant tokens; writes RUN_DIR/final as an HF model directory.

    Overrides follow the config path, e.g. `rlkit sft sft.toml optim.lr=1e-4 --data.epochs 2`.
    """
    from rlkit.config import dump_toml, load_config
    from rlkit.trainer.config import SFTConfig

    overrides = list(ctx.args)
    cfg = load_config(SFTConfig, config, overrides)  # validate before anything starts
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: must be at least 1")
    resume_arg = resume_from or ("latest" if resume else None)
    if dry_run:
        Console().print(dump_toml(cfg), markup=False)
        return
    if nproc > 1:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        argv += [f"--nproc_per_node={nproc}", "-m", "rlkit.trainer.main", "--mode", "sft"]
        argv += ["--config", str(config), *([f"--resume={resume_arg}"] if resume_arg else [])]
        os.execv(argv[0], argv + overrides)
    from rlkit.trainer.main import run

    run("sft", str(config), overrides, resume_arg)
