"""A PEFT LoRA adapter for a tiny model, written without a trainer (tests that load adapters)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rlkit.protocol.model import LoraConfig
from rlkit.trainer.lora import add_lora, to_peft_state, write_adapter


def make_adapter(model_dir: Path, out: Path, rank: int = 8, seed: int = 0) -> Path:
    """`out` holding a rank-`rank` adapter of `model_dir` whose B matrices are random (so it
    changes the model's logprobs)."""
    torch.manual_seed(seed)
    cfg = LoraConfig(rank=rank, alpha=2.0 * rank)
    lm = add_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16), cfg)
    state = {k: v.detach().clone() for k, v in lm.state_dict().items() if "lora_" in k}
    for name, tensor in state.items():
        if "lora_B" in name:
            tensor.normal_(0.0, 0.5)
    out.mkdir(parents=True, exist_ok=True)
    write_adapter(out, to_peft_state(state), cfg, str(model_dir))
    return out
