"""Trainer entry point, identical as one process and under `torchrun --nproc-per-node N`:

python -m rlkit.trainer.main --config X.toml [--mode rl|sft] [--resume [latest|DIR]]
    [--section.field=VALUE ...]

`trainer_command` builds that command line (with torchrun for several ranks) for every caller:
`rlkit train` launching its trainer and `rlkit sft`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from rlkit.config import load_config
from rlkit.errors import UsageError
from rlkit.lifetime import die_with_parent
from rlkit.trainer.batch import MalformedBatchError


def trainer_command(
    config_path: str | Path, nproc: int, *, mode: str = "rl", resume: bool | str | None = None
) -> list[str]:
    """The trainer's command line: one process, or torchrun with `nproc` ranks on this machine
    (`--standalone`: a private rendezvous, so two runs on one machine never collide).
    `config_path` is the resolved config: overrides are not passed on, since torchrun would
    read `--nproc...` among them as its own options. `resume`: True or "latest" for the run's
    latest checkpoint, or a checkpoint directory."""
    args = ["-m", "rlkit.trainer.main", "--config", str(config_path), "--mode", mode]
    if resume is True or resume == "latest":
        args.append("--resume")
    elif resume:
        args.append(f"--resume={resume}")
    if nproc == 1:
        return [sys.executable, *args]
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    return [sys.executable, *torchrun, *args]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m rlkit.trainer.main", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("--config", required=True, help="TOML file (TrainerConfig or SFTConfig)")
    parser.add_argument("--mode", choices=["rl", "sft"], default="rl")
    parser.add_argument(
        "--resume", nargs="?", const="latest", default=None, help="'latest' or a checkpoint dir"
    )
    return parser.parse_known_args(argv)


def run(mode: str, config_path: str, overrides: list[str], resume: str | None = None) -> None:
    """Load the config for `mode` and train; shared by this module and `rlkit sft`."""
    from rlkit.trainer.config import SFTConfig, TrainerConfig

    model = SFTConfig if mode == "sft" else TrainerConfig
    cfg = load_config(model, config_path, overrides)
    if resume:
        cfg.ckpt.resume = resume
    if mode == "sft":
        from rlkit.trainer.sft import run_sft

        run_sft(cfg)
    else:
        from rlkit.trainer.rl import run_rl

        run_rl(cfg)


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if "LOCAL_RANK" in os.environ:  # a torchrun rank: die with the agent (rlkit.lifetime)
        die_with_parent()
    try:
        run(args.mode, args.config, overrides, args.resume)
    except UsageError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    except (MalformedBatchError, TimeoutError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
