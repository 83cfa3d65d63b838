"""Trainer entry point, identical as one process and under `torchrun --nproc_per_node N`:

python -m rlkit.trainer.main --config X.toml [--mode rl|sft] [--resume [latest|DIR]] [a.b=v ...]
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from rlkit.config import load_config
from rlkit.errors import UsageError
from rlkit.trainer.batch import MalformedBatchError


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m rlkit.trainer.main", description=__doc__)
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
