"""Build randomly initialised Qwen3 / Qwen3-MoE models plus a local tokenizer, in HF format.

`tiny` is a few hundred thousand parameters (tests); `small` is tens of millions (benchmarks).
Head dimension is 64 everywhere because vLLM's CPU attention supports 64 but not 16.
The result is deterministic for a seed: same seed, byte-identical safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from rlkit.atomic import atomic_dir
from rlkit.errors import UsageError

Arch = Literal["qwen3", "qwen3-moe"]
Size = Literal["tiny", "small"]

SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        moe_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
    ),
    "small": dict(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        moe_intermediate_size=384,
        num_experts=8,
        num_experts_per_tok=2,
    ),
}
MAX_POSITIONS = 4096


def build_config(
    arch: Arch, size: Size, vocab_size: int, eos_id: int, pad_id: int, tie_embeddings: bool = False
):
    """The transformers config for an architecture and size."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    s = SHAPES[size]
    common = dict(
        vocab_size=vocab_size,
        hidden_size=s["hidden_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"],
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        rope_theta=10000.0,
        dtype="bfloat16",
    )
    if arch == "qwen3":
        return Qwen3Config(intermediate_size=s["intermediate_size"], **common)
    if arch == "qwen3-moe":
        return Qwen3MoeConfig(
            intermediate_size=s["intermediate_size"],
            moe_intermediate_size=s["moe_intermediate_size"],
            num_experts=s["num_experts"],
            num_experts_per_tok=s["num_experts_per_tok"],
            decoder_sparse_step=1,
            norm_topk_prob=True,
            **common,
        )
    raise UsageError(f"unknown --arch {arch!r}; choose qwen3 or qwen3-moe")


def init_tiny(
    out: str | Path,
    arch: Arch = "qwen3",
    size: Size = "tiny",
    seed: int = 0,
    force: bool = False,
    tie_embeddings: bool = False,
) -> Path:
    """Create the model directory `out` (config, bf16 safetensors, tokenizer, chat template).

    Embeddings are untied by default; `tie_embeddings=True` mirrors small Qwen3 checkpoints.

    Written to a temporary sibling first and renamed, so `out` is never half-written.
    """
    from transformers import AutoModelForCausalLM

    from rlkit.models.tokenizer import EOS_TOKEN, PAD_TOKEN, save_hf_tokenizer, train_tokenizer

    if size not in SHAPES:
        raise UsageError(f"unknown --size {size!r}; choose tiny or small")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty (pass --force to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(SHAPES[size]["vocab_size"])
    config = build_config(
        arch,
        size,
        tok.get_vocab_size(),
        tok.token_to_id(EOS_TOKEN),
        tok.token_to_id(PAD_TOKEN),
        tie_embeddings,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(torch.bfloat16)

    with atomic_dir(out, durable=False) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        save_hf_tokenizer(tok, tmp, MAX_POSITIONS)
        gen = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        meta = {
            "arch": arch,
            "size": size,
            "seed": seed,
            "tie_embeddings": tie_embeddings,
            "parameters": model.num_parameters(),
        }
        (tmp / "rlkit_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out
