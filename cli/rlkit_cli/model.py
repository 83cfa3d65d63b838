"""`rlkit model ...`: build local models."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="Build and inspect models.", no_args_is_help=True)


@app.command("init-tiny")
def init_tiny_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the HF model into."),
    arch: str = typer.Option("qwen3", help="Architecture: qwen3 or qwen3-moe."),
    size: str = typer.Option("tiny", help="tiny (<1M parameters, tests) or small (~30M)."),
    seed: int = typer.Option(0, help="Seed for the random weights (deterministic)."),
    force: bool = typer.Option(False, help="Overwrite a non-empty output directory."),
    tie_embeddings: bool = typer.Option(False, help="Share input and output embeddings."),
) -> None:
    """Create a randomly initialised model plus a locally trained BPE tokenizer."""
    from rlkit.errors import UsageError
    from rlkit.models import init_tiny

    if arch not in ("qwen3", "qwen3-moe"):
        raise UsageError(f"unknown --arch {arch!r}; choose qwen3 or qwen3-moe")
    path = init_tiny(
        out, arch=arch, size=size, seed=seed, force=force, tie_embeddings=tie_embeddings
    )  # type: ignore[arg-type]
    import json

    meta = json.loads((path / "rlkit_model.json").read_text())
    Console().print(f"wrote {arch}/{size} model ({meta['parameters']:,} parameters) to {path}")
