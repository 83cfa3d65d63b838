"""`rlkit infer`: serve a model with vLLM plus rlkit's weight-sync routes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from rlkit.ports import INFERENCE_PORT


def infer(
    ctx: typer.Context,
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="The model: a local HF directory or an HF name. It is served under that name, so "
        "`rlkit eval ENV -m` takes the same value.",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(INFERENCE_PORT, min=1, max=65535, help="Port to bind."),
    lora_rank: int = typer.Option(
        0, min=0, help="Serve LoRA adapters up to this rank (0 = off); runs load theirs by name."
    ),
    max_loras: int = typer.Option(4, min=1, help="With --lora-rank: adapters in one batch."),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="The owner's token file (mode 0600) [$RLKIT_HOME/infer/PORT/token, created].",
    ),
    tenant: list[str] = typer.Option(
        [], "--tenant", help="A run sharing this server: its own token file (repeatable)."
    ),
    allowed_weights_root: list[Path] = typer.Option(
        [],
        "--allowed-weights-root",
        help="A directory weights and adapters may be loaded from (repeatable); none = none.",
    ),
    max_update_s: float = typer.Option(
        300.0, min=1, help="The longest a weight update may keep generation paused."
    ),
) -> None:
    """Launch an OpenAI-compatible vLLM server that accepts new weights in place.

    Extra arguments after `--` go to vLLM unchanged, e.g. `rlkit infer -m DIR -- --max-num-seqs 8`.
    With `--lora-rank R` one server serves several `rlkit train` runs, each with its own adapter
    (`--inference.urls` in each run's config; see examples/lora-shared-pool).

    Every route but /health needs the server's token (printed: its file) or a tenant's
    (`--tenant NAME`, one file each: give a run its file as `inference.token_file`). Weights
    load only from `--allowed-weights-root` directories.
    """
    from rlkit.extras import require_train_extra

    require_train_extra("rlkit infer")
    from rlkit.inference.engine_args import (
        check_model_dir,
        lora_server_args,
        security_args,
        server_command,
        server_env,
    )
    from rlkit.inference.temp_dirs import RPC_DIR_OWNER, server_temp_dir
    from rlkit.inference.tenancy import infer_credentials
    from rlkit.ports import check_port_free
    from rlkit.protocol.credentials import TOKEN_FILE_ENV

    check_model_dir(model)
    check_port_free(host, port)
    creds = infer_credentials(port, token_file, tenant)
    lora = lora_server_args(lora_rank, max_loras)
    security = security_args(allowed_weights_root, creds.tenants_dir, max_update_s)
    argv = server_command(model, host, port, [*security, *lora, *ctx.args])
    typer.echo(f"token file: {creds.token_file} (clients: rlkit eval --token-file FILE)")
    for name, path in creds.tenant_files.items():
        typer.echo(f"tenant {name}: {path} (that run's inference.token_file)")
    env = {**server_env(), TOKEN_FILE_ENV: str(creds.token_file)}
    temp_dir = server_temp_dir(env)  # what vLLM leaves in the temporary folder goes there
    (temp_dir / RPC_DIR_OWNER).write_text(str(os.getpid()))  # the server's pid: exec keeps it
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)
