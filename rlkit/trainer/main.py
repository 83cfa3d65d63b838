"""Trainer entry point, identical as one process and under torchrun (one node or several):

python -m rlkit.trainer.main --config X.toml [--mode rl|sft] [--resume [latest|DIR]]
    [--section.field=VALUE ...]

`trainer_command` builds that command line (with torchrun for several ranks) for every caller:
`rlkit train` launching its trainer and `rlkit sft`.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rlkit.config import load_config
from rlkit.errors import UsageError
from rlkit.lifetime import die_with_parent
from rlkit.progress import make_console, print_error
from rlkit.protocol.batch import MalformedBatchError
from rlkit.trainer.allocator import loaded_allocator


@dataclass(frozen=True)
class TrainerRanks:
    """Where the trainer's ranks run: `nproc` per node on `nnodes` nodes.

    Several nodes meet through torchrun's c10d rendezvous at `rdzv_endpoint` (HOST:PORT);
    node 0 hosts its store (said explicitly: on one machine every node would claim it).
    `rdzv_id` names the job, the same on every node and different for two jobs.
    """

    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    rdzv_id: str = "rlkit"

    def torchrun_args(self) -> list[str]:
        """`-m torch.distributed.run ...` options (no restarts: a lost rank ends the run). No
        log folder: torchrun would make one in the temporary folder per run and never remove
        it, and the ranks write to the trainer's own log."""
        args = ["-m", "torch.distributed.run", "--nproc-per-node", str(self.nproc)]
        if self.nnodes == 1:
            return [*args, "--standalone", "--log-dir", os.devnull]
        is_host = "true" if self.node_rank == 0 else "false"
        return [
            *args,
            "--nnodes",
            str(self.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            "--rdzv-id",
            self.rdzv_id,
            "--rdzv-conf",
            f"is_host={is_host}",
            "--max-restarts",
            "0",
            "--log-dir",
            os.devnull,
        ]


def trainer_command(
    config_path: str | Path,
    ranks: TrainerRanks | int,
    *,
    mode: str = "rl",
    resume: bool | str | None = None,
) -> list[str]:
    """The trainer's command line: one process, or torchrun (`ranks`, or a rank count on this
    machine, where `--standalone` keeps two runs on one machine from colliding).
    `config_path` is the resolved config: overrides are not passed on, since torchrun would
    read `--nproc...` among them as its own options. `resume`: True or "latest" for the run's
    latest checkpoint, or a checkpoint directory."""
    ranks = TrainerRanks(nproc=ranks) if isinstance(ranks, int) else ranks
    args = ["-m", "rlkit.trainer.main", "--config", str(config_path), "--mode", mode]
    if resume is True or resume == "latest":
        args.append("--resume")
    elif resume:
        args.append(f"--resume={resume}")
    if ranks.nproc == 1 and ranks.nnodes == 1:
        return [sys.executable, *args]
    return [sys.executable, *ranks.torchrun_args(), *args]


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
    if os.environ.get("RANK", "0") == "0":
        make_console().print(f"memory allocator: {loaded_allocator()}")
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
        print_error(make_console(stderr=True), exc)
        sys.exit(2)
    except (MalformedBatchError, TimeoutError) as exc:
        print_error(make_console(stderr=True), exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
