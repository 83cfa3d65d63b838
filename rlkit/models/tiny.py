"""Build randomly initialised Qwen3 / Qwen3-MoE models plus a local tokenizer, in HF format.

`tiny` is a few hundred thousand parameters (tests); `small` is tens of millions (benchmarks).
Head dimension is 64 in both because vLLM's CPU attention supports 64 but not 16. Real shapes
(`rlkit.models.shapes`: `qwen3-0.6b`, ...) or any HF `config.json` give models at the sizes
people train, with the local tokenizer's vocabulary padded to the real size.
The result is deterministic for a seed: same seed, byte-identical safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from rlkit.atomic import atomic_dir
from rlkit.errors import UsageError
from rlkit.models.shapes import REAL_SHAPES, file_config, real_config

Arch = Literal["qwen3", "qwen3-moe"]
Size = str  # a key of SHAPES or of shapes.REAL_SHAPES

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
# the BPE trained for real shapes and config files, before padding to their vocabulary
REAL_TOKENIZER_VOCAB = 8192


def size_names() -> list[str]:
    """Every `--size` choice: the toy shapes, then the real ones."""
    return [*SHAPES, *REAL_SHAPES]


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
    arch: Arch | None = None,
    size: Size = "tiny",
    seed: int = 0,
    force: bool = False,
    tie_embeddings: bool = False,
    config_file: str | Path | None = None,
) -> Path:
    """Create the model directory `out` (config, bf16 safetensors, tokenizer, chat template).

    `size` names a toy shape (`arch` picks Qwen3 or Qwen3-MoE, default qwen3; embeddings untied
    unless `tie_embeddings`) or a real one (its own arch and tying; a different `arch` is an
    error); `config_file` (an HF config.json) replaces `size`.

    Written to a temporary sibling first and renamed, so `out` is never half-written.
    """
    from rlkit.models.tokenizer import EOS_TOKEN, PAD_TOKEN, pad_vocabulary, train_tokenizer

    if size not in SHAPES and size not in REAL_SHAPES:
        raise UsageError(f"unknown --size {size!r}; choose one of {', '.join(size_names())}")
    real = config_file is not None or size in REAL_SHAPES
    if size in REAL_SHAPES and config_file is None:
        shape_arch = REAL_SHAPES[size]["arch"]
        if arch is not None and arch != shape_arch:
            raise UsageError(f"--size {size} is a {shape_arch} shape, not --arch {arch}")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty (pass --force to overwrite)")

    tok = train_tokenizer(REAL_TOKENIZER_VOCAB if real else SHAPES[size]["vocab_size"])
    eos, pad = tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)
    if config_file is not None:
        config = file_config(str(config_file), eos, pad)
    elif real:
        config = real_config(size, eos, pad, MAX_POSITIONS)
    else:
        config = build_config(arch or "qwen3", size, tok.get_vocab_size(), eos, pad, tie_embeddings)
    if config.vocab_size < tok.get_vocab_size():
        raise UsageError(
            f"vocab_size {config.vocab_size} is smaller than the local tokenizer's "
            f"{tok.get_vocab_size()} entries"
        )
    if config.vocab_size > tok.get_vocab_size():
        tok = pad_vocabulary(tok, config.vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = _random_model(config, seed)
    with atomic_dir(out, durable=False) as tmp:
        _write(model, tok, tmp)
        meta = {
            "arch": config.model_type.replace("_", "-"),
            "size": "config" if config_file is not None else size,
            "seed": seed,
            "tie_embeddings": bool(config.tie_word_embeddings),
            "parameters": model.num_parameters(),
        }
        (tmp / "rlkit_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def _random_model(config, seed: int):
    """A bf16 model of `config` with transformers' own random init, made in fp32 and cast (the
    fp32 copy costs 4 bytes a parameter for a moment: 2.4 GB at 0.6 B)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(torch.bfloat16)


def _write(model, tok, tmp: Path) -> None:
    from rlkit.models.tokenizer import save_hf_tokenizer

    config = model.config
    model.save_pretrained(tmp, safe_serialization=True)
    save_hf_tokenizer(tok, tmp, min(MAX_POSITIONS, config.max_position_embeddings))
    gen = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
