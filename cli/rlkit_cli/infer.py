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
) -> None:
    """Launch an OpenAI-compatible vLLM server that accepts new weights in place.

    Extra arguments after `--` go to vLLM unchanged, e.g. `rlkit infer -m DIR -- --max-num-seqs 8`.
    """
    from rlkit.inference.lifecycle import (
        check_model_dir,
        check_port_free,
        server_command,
        server_env,
    )

    check_model_dir(model)
    check_port_free(host, port)
    argv = server_command(model, host, port, list(ctx.args))
    sys.stdout.flush()
    os.execvpe(argv[0], argv, server_env())
