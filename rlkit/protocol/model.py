"""The model a run trains: `[model]` and `[model.lora]`, read by the launcher, the orchestrator
(which model, or which adapter, the servers serve) and the trainer alike."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import Field

from rlkit.config import Config

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Config):
    """`[model.lora]`: train a LoRA adapter on the frozen base instead of every weight."""

    rank: int = Field(0, ge=0, description="Adapter rank r (0 = LoRA off: train all weights).")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha: the update is scaled by alpha/r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS),
        min_length=1,
        description="Module names that get an adapter (default: attention and MLP projections).",
    )
    name: str = Field(
        "",
        description="Name the inference servers serve the adapter under (requests use it as "
        "`model`); empty = derived from the run directory. Unique per run on a shared pool.",
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def served_name(self, run_dir: str | Path) -> str:
        """`name`, or one derived from the run directory: its name plus a hash of its absolute
        path, so two runs on one server never share an adapter by accident."""
        if self.name:
            return self.name
        path = Path(run_dir).resolve()
        return f"{path.name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


class ModelConfig(Config):
    path: str = Field("", description="Local HF model directory or HF model name to train.")
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer in backward to save activation memory."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype: auto = bf16 mixed precision on GPU, fp32 on CPU."
    )
    attention: Literal["auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3"] = Field(
        "auto",
        description="Attention kernel: auto = varlen flash attention for packed rows on GPU when "
        "installed, sdpa with a block-causal mask otherwise (and on CPU).",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig, description="LoRA adapter training (off unless rank > 0)."
    )
