"""Load an HF causal LM, shard it with FSDP2 and compute per-token logprobs of micro-batches.

`PolicyModel` wraps the HF model so that one FSDP2 root forward covers the decoder *and* the
LM-head projection: `fully_shard` goes on every decoder layer, then on the wrapper, whose
pre-forward hook unshards the embeddings, final norm and `lm_head`. Inside `forward`,
`lm_head.weight` is therefore a full tensor and `chunked_logprobs` never builds [N, V] logits.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from rlkit.errors import UsageError
from rlkit.trainer.config import ModelConfig
from rlkit.trainer.logprobs import chunked_logprobs
from rlkit.trainer.routing import RouterControl


class PolicyModel(nn.Module):
    """HF causal LM + chunked logprobs of the counted target tokens of a micro-batch."""

    def __init__(self, lm: nn.Module, chunk_size: int) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.router = RouterControl(lm)  # MoE routing hooks (no routers: a no-op)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        flat_index: Tensor,
        targets: Tensor,
        temperatures: Tensor | None = None,
        routing: Tensor | None = None,
        replay: bool = False,
        token_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Returns (logprobs [N], entropy [N]) of `targets` at hidden positions `flat_index`,
        with the logits divided by each target's sampling temperature ([N], default 1).

        `routing` ([R, L, moe_layers, k]) is the batch's known expert choice: compared with
        the routers' own (`self.router.disagreement`) and used instead of it when `replay`.
        With `token_mask` ([R, L], real tokens) the MoE load-balancing loss of this forward is
        left in `self.aux_loss` (computed here, inside the FSDP root forward).
        """
        self.router.set_routing(None if routing is None else routing.flatten(0, 1), replay)
        self.router.keep_logits = token_mask is not None
        out = self.lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        if token_mask is not None:
            self.aux_loss = self.router.aux_loss(token_mask.flatten())
        hidden = out.last_hidden_state.flatten(0, 1)[flat_index]
        logprobs, entropy = chunked_logprobs(
            hidden,
            self.lm.lm_head.weight,
            targets,
            chunk_size=self.chunk_size,
            temperature=1.0 if temperatures is None else temperatures,
            with_entropy=True,
        )
        return logprobs, entropy


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (`model.layers` in Llama/Qwen-style models)."""
    layers = getattr(getattr(lm, "model", None), "layers", None)
    if layers is None:
        raise UsageError(f"{type(lm).__name__}: cannot find decoder layers at .model.layers")
    return list(layers)


def compute_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.dtype)


def load_policy(cfg: ModelConfig, device: torch.device, chunk_size: int) -> PolicyModel:
    """Load fp32 master weights, enable activation checkpointing if asked, apply FSDP2."""
    from transformers import AutoModelForCausalLM

    if not cfg.path:
        raise UsageError("model.path is empty: set it to a local HF model directory or HF name")
    if Path(cfg.path).exists() and not (Path(cfg.path) / "config.json").is_file():
        raise UsageError(f"model.path {cfg.path}: no config.json (not an HF model directory)")
    try:
        lm = AutoModelForCausalLM.from_pretrained(
            cfg.path, dtype=torch.float32, attn_implementation="sdpa"
        )
    except OSError as exc:
        raise UsageError(f"cannot load model.path {cfg.path!r}: {exc}") from exc
    lm.config.use_cache = False
    if cfg.activation_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.to(device)
    dtype = compute_dtype(cfg, device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(lm):
        fully_shard(layer, mp_policy=mp)
    policy = PolicyModel(lm, chunk_size)
    fully_shard(policy, mp_policy=mp)
    return policy
