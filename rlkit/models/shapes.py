"""Named real model shapes (Qwen3 family) for random-init models at the sizes people train.

The numbers are the released models' `config.json` fields; nothing is downloaded. `medium` is
not a released model: the real 151,936-token vocabulary on a few small layers (~65 M
parameters), so tests cover the real-vocabulary path at a cost CI can pay.
"""

from __future__ import annotations

from typing import Any

QWEN3_VOCAB = 151_936

# fields every Qwen3 dense shape shares
_QWEN3: dict[str, Any] = dict(
    arch="qwen3", vocab_size=QWEN3_VOCAB, tie_word_embeddings=True, rope_theta=1_000_000.0
)
# a 0.6B/1.7B-style stack: 28 layers, 16 query / 8 KV heads of 128
_QWEN3_STACK: dict[str, Any] = dict(
    **_QWEN3, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128
)

# arch + the HF config fields that differ from rlkit's defaults (tiny.build_config's `common`)
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "medium": dict(
        **_QWEN3,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
    ),
    "qwen3-0.6b": dict(**_QWEN3_STACK, hidden_size=1024, intermediate_size=3072),
    "qwen3-1.7b": dict(**_QWEN3_STACK, hidden_size=2048, intermediate_size=6144),
    "qwen3-30b-a3b": dict(
        arch="qwen3-moe",
        vocab_size=QWEN3_VOCAB,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        decoder_sparse_step=1,
        norm_topk_prob=True,
    ),
}


def real_config(name: str, eos_id: int, pad_id: int, max_positions: int):
    """The transformers config of the named shape, with the local tokenizer's special ids."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    fields = dict(REAL_SHAPES[name])
    arch = fields.pop("arch")
    cls = Qwen3MoeConfig if arch == "qwen3-moe" else Qwen3Config
    return cls(
        max_position_embeddings=max_positions,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="bfloat16",
        **fields,
    )


def file_config(path: str, eos_id: int, pad_id: int):
    """A transformers config from any HF `config.json`, the local tokenizer's special ids set."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    from rlkit.errors import UsageError

    try:
        fields = json.loads(Path(path).read_text())
        model_type = fields.pop("model_type")
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--config {path}: not a readable HF config.json ({exc})") from None
    fields.update(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id, dtype="bfloat16")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        raise UsageError(f"--config {path}: {exc}") from None


def parameter_count(config) -> int:
    """Parameters of a model built from `config`, counted on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model.num_parameters()
