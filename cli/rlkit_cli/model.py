"""`rlkit model ...`: build local models, merge a LoRA adapter into its base."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from rlkit.progress import make_console

app = typer.Typer(help="Build and inspect models.", no_args_is_help=True)


@app.callback()
def needs_trainer() -> None:
    """Build and inspect models."""
    from rlkit.extras import require_train_extra

    require_train_extra("rlkit model")


class Arch(StrEnum):
    QWEN3 = "qwen3"
    QWEN3_MOE = "qwen3-moe"


# the toy shapes, then the real ones (rlkit.models.shapes); typer names them on a bad value
Size = StrEnum(
    "Size",
    {
        name: name
        for name in ["tiny", "small", "medium", "qwen3-0.6b", "qwen3-1.7b", "qwen3-30b-a3b"]
    },
)


@app.command("init-tiny")
def init_tiny_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the HF model into."),
    arch: Arch | None = typer.Option(
        None, help="Architecture of a toy size (default qwen3); a real size has its own."
    ),
    size: Size = typer.Option(
        "tiny",
        help="tiny (<1M parameters, tests), small (~34M), medium (~65M, the real vocabulary), "
        "or a real shape: qwen3-0.6b, qwen3-1.7b, qwen3-30b-a3b (Qwen3-MoE).",
    ),
    config: Path | None = typer.Option(
        None, "--config", help="Any HF config.json to build instead of a named size."
    ),
    seed: int = typer.Option(0, help="Seed for the random weights (deterministic)."),
    force: bool = typer.Option(False, help="Overwrite a non-empty output directory."),
    tie_embeddings: bool = typer.Option(False, help="Share input and output embeddings."),
) -> None:
    """Create a randomly initialised model plus a locally trained BPE tokenizer."""
    from rlkit.models import init_tiny

    path = init_tiny(
        out,
        arch=arch.value if arch else None,
        size=size.value,
        seed=seed,
        force=force,
        tie_embeddings=tie_embeddings,
        config_file=config,
    )
    import json

    meta = json.loads((path / "rlkit_model.json").read_text())
    shape = f"{meta['arch']}/{meta['size']}"
    make_console().print(f"wrote {shape} model ({meta['parameters']:,} parameters) to {path}")


@app.command("merge")
def merge_cmd(
    adapter: Path = typer.Argument(..., help="PEFT LoRA adapter directory (adapter_config.json)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the merged HF model."),
    base: str = typer.Option(
        "", help="Base model directory; default: the adapter's base_model_name_or_path."
    ),
) -> None:
    """Fold a LoRA adapter into its base model (peft merge_and_unload): a plain HF model that
    transformers and vLLM load without LoRA support."""
    from rlkit.trainer.lora import adapter_base, merge_adapter

    path = merge_adapter(base or adapter_base(adapter), adapter, out)
    make_console().print(f"wrote merged model to {path}")
