"""LoRA adapters with peft: inject them into the HF model, name their tensors the PEFT way,
write an adapter directory vLLM loads by name, and merge one into its base.

peft's `inject_adapter_in_model` swaps each target `nn.Linear` for a LoRA layer in place (the
model keeps its class, so `PolicyModel` runs it unchanged) and freezes everything but the
adapter. FSDP2 then shards the LoRA layers like any other parameters: each decoder layer's
group holds its frozen base weights and its trainable A/B matrices, and only the latter get
gradients, optimiser state and checkpoint space.

An adapter directory is PEFT's format: `adapter_config.json` + `adapter_model.safetensors` with
tensors named `base_model.model.<module>.lora_A.weight`, which `PeftModel.from_pretrained` and
vLLM's `--enable-lora` both read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlkit.atomic import atomic_dir
from rlkit.errors import UsageError
from rlkit.inference.weights import ADAPTER_CONFIG, ADAPTER_WEIGHTS, check_adapter_dir
from rlkit.protocol.model import LoraConfig

PEFT_PREFIX = "base_model.model."
ADAPTER_NAME = "default"  # peft's name of the (only) adapter inside the model


def peft_config(cfg: LoraConfig, base_model: str = "") -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        base_model_name_or_path=base_model or None,
        task_type="CAUSAL_LM",
        bias="none",
    )


def add_lora(lm: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Inject LoRA layers into `lm` in place (base frozen, A random, B zero); returns `lm`."""
    from peft import inject_adapter_in_model

    try:
        inject_adapter_in_model(peft_config(cfg), lm, adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise UsageError(f"model.lora.target_modules: {exc}") from exc
    return lm


def store_frozen_in(lm: nn.Module, dtype: torch.dtype) -> None:
    """Keep the frozen base's parameters in `dtype`, the checkpoint's own (bf16 for rlkit's and
    Qwen3's): they never change, so nothing is lost, and a bf16 base takes half an fp32 one's
    memory (2 of a LoRA trainer's ~5 bytes per base parameter). FSDP2 still computes in its
    `param_dtype`: each layer's gather casts. A wider `dtype` than the model's is left alone."""
    for param in lm.parameters():
        if not param.requires_grad and dtype.itemsize < param.dtype.itemsize:
            param.data = param.data.to(dtype)


def to_peft_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a model state dict (keys relative to the HF model) under PEFT's
    saved names: `model.layers.0.q_proj.lora_A.default.weight` ->
    `base_model.model.model.layers.0.q_proj.lora_A.weight`."""
    tag = f".{ADAPTER_NAME}."
    return {PEFT_PREFIX + k.replace(tag, "."): v for k, v in state.items() if "lora_" in k}


def write_adapter(
    out: Path, tensors: dict[str, torch.Tensor], cfg: LoraConfig, base_model: str
) -> None:
    """Write a PEFT adapter directory (config + safetensors) into `out`, which exists."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / ADAPTER_WEIGHTS))
    peft_config(cfg, base_model).save_pretrained(str(out))


def adapter_base(path: str | Path) -> str:
    """The base model an adapter directory names (`base_model_name_or_path`)."""
    try:
        base = json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{path}: not a PEFT LoRA adapter directory ({exc})") from exc
    if not base:
        raise UsageError(f"{path}: the adapter names no base model; pass --base")
    return str(base)


def merge_adapter(base: str | Path, adapter: str | Path, out: Path) -> Path:
    """Load `base` + `adapter`, fold the adapter into the weights (peft's merge_and_unload) and
    save the result with the base's tokenizer as a plain HF model directory at `out`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_adapter_dir(adapter)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto")
        tokenizer = AutoTokenizer.from_pretrained(str(base))
    except OSError as exc:
        raise UsageError(f"cannot load base model {base}: {exc}") from exc
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with atomic_dir(out) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out
