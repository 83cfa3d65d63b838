"""`rlkit infer`: serve a model with vLLM plus rlkit's weight-sync routes."""

from __future__ import annotations

import os
import sys

import typer

from rlkit.ports import INFERENCE_PORT


def infer(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", "-m", help="Local HF model directory or HF name."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(INFERENCE_PORT, min=1, max=65535, help="Port to bind."),
    lora_rank: int = typer.Option(
        0, min=0, help="Serve LoRA adapters up to this rank (0 = off); runs load theirs by name."
    ),
    max_loras: int = typer.Option(4, min=1, help="With --lora-rank: adapters in one batch."),
) -> None:
    """Launch an OpenAI-compatible vLLM server that accepts new weights in place.

    Extra arguments after `--` go to vLLM unchanged, e.g. `rlkit infer -m DIR -- --max-num-seqs 8`.
    With `--lora-rank R` one server serves several `rlkit train` runs, each with its own adapter
    (`--inference.urls` in each run's config; see examples/lora-shared-pool).
    """
    from rlkit.inference.lifecycle import (
        check_model_dir,
        check_port_free,
        lora_server_args,
        server_command,
        server_env,
    )

    check_model_dir(model)
    check_port_free(host, port)
    lora = lora_server_args(lora_rank, max_loras)
    argv = server_command(model, host, port, [*lora, *ctx.args])
    sys.stdout.flush()
    os.execvpe(argv[0], argv, server_env())
