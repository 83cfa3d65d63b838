"""Load an HF causal LM, shard it with FSDP2 and compute per-token logprobs of micro-batches.

`PolicyModel` wraps the HF model so that one FSDP2 root forward covers the decoder *and* the
LM-head projection: `fully_shard` goes on every decoder layer, then on the wrapper, whose
pre-forward hook unshards the embeddings, final norm and `lm_head`. Inside `forward`,
`lm_head.weight` is therefore a full tensor and `chunked_logprobs` never builds [N, V] logits.
On one rank, groups that FSDP2 would neither shard nor cast stay plain tensors (`_shard`).
With context parallelism the embeddings and the LM head are a group of their own that is never
gathered whole: each rank of a context group computes with its slice of the vocabulary
(`rlkit.trainer.vocab_parallel`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn import functional as F

from rlkit.errors import UsageError
from rlkit.protocol.model import LoraConfig, ModelConfig
from rlkit.trainer import context_parallel as cp
from rlkit.trainer import vocab_parallel as vp
from rlkit.trainer.dist import is_main, world_size
from rlkit.trainer.logprobs import chunked_logprobs
from rlkit.trainer.lora import add_lora, store_frozen_in
from rlkit.trainer.rank0_load import load_from_rank0
from rlkit.trainer.routing import RouterControl


class PolicyModel(nn.Module):
    """HF causal LM + chunked logprobs of the counted target tokens of a micro-batch."""

    def __init__(
        self,
        lm: nn.Module,
        chunk_size: int,
        vocab: cp.ContextGroup | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.router = RouterControl(lm)  # MoE routing hooks (no routers: a no-op)
        # the group the vocabulary is split over (`rlkit.trainer.vocab_parallel`); None: FSDP2
        # gathers the embeddings and the LM head whole
        self.vocab = vocab
        self.dtype = dtype  # the decoder's compute dtype, the split embeddings' output's

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
        rows: cp.RowAttention | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Returns (logprobs [N], entropy [N]) of `targets` at hidden positions `flat_index`,
        with the logits divided by each target's sampling temperature ([N], default 1).

        `routing` ([R, L, moe_layers, k]) is the batch's known expert choice: compared with
        the routers' own (`self.router.disagreement`) and used instead of it when `replay`.
        With `token_mask` ([R, L], real tokens) the MoE load-balancing loss of this forward is
        left in `self.aux_loss` (computed here, inside the FSDP root forward).
        With context parallelism (`rlkit.trainer.context_parallel`) the inputs are this rank's
        columns of the rows and `rows` says where they are; without `rows` every rank holds
        whole rows.
        """
        self.router.set_routing(None if routing is None else routing.flatten(0, 1), replay)
        self.router.keep_logits = token_mask is not None
        kwargs: dict[str, Any] = {"position_ids": position_ids, "use_cache": False}
        if self.lm.config._attn_implementation == cp.ATTENTION:
            kwargs["rows"] = rows if rows is not None else cp.unsplit_rows(position_ids)
        embedding = self.lm.model.embed_tokens
        head: vp.VocabSlice | None = None
        if self.vocab is not None:
            head = vp.take(self.lm.lm_head.weight, self.vocab)
            tied = embedding.weight is self.lm.lm_head.weight
            table = head if tied else vp.take(embedding.weight, self.vocab)
            embeds = vp.embed(input_ids, table, embedding.padding_idx).to(self.dtype)
            out = self.lm.model(inputs_embeds=embeds, **kwargs)
        elif trained_tied(embedding, self.lm.lm_head):
            embeds = embed_into_weight_grad(embedding, input_ids)
            out = self.lm.model(inputs_embeds=embeds, **kwargs)
        else:
            out = self.lm.model(input_ids=input_ids, **kwargs)
        if token_mask is not None:
            group = rows.group if rows is not None else None
            total = None if group is None else (lambda x: cp.sum_copies(x, group))
            self.aux_loss = self.router.aux_loss(token_mask.flatten(), total)
        hidden = out.last_hidden_state.flatten(0, 1)[flat_index]
        temperature = 1.0 if temperatures is None else temperatures
        if head is not None:
            return vp.logprobs(hidden, head, targets, self.chunk_size, temperature, True)
        logprobs, entropy = chunked_logprobs(
            hidden,
            self.lm.lm_head.weight,
            targets,
            chunk_size=self.chunk_size,
            temperature=temperature,
            with_entropy=True,
        )
        return logprobs, entropy


def trained_tied(embedding: nn.Module, lm_head: nn.Module) -> bool:
    """Whether a plain `nn.Embedding` shares its trainable weight with the LM head."""
    weight = getattr(embedding, "weight", None)
    return (
        type(embedding) is nn.Embedding  # not a subclass that scales or adds to the lookup
        and weight is getattr(lm_head, "weight", None)
        and weight.requires_grad
    )


def embed_into_weight_grad(embedding: nn.Embedding, input_ids: Tensor) -> Tensor:
    """`embedding(input_ids)`, with the rows' gradient added into `embedding.weight.grad` in
    place by a hook, for a weight tied to the LM head.

    Through autograd, the lookup's backward builds a dense [V, H] gradient at the end of the
    backward, and the engine adds it to the LM head's gradient of the same weight, computed at
    the start: two [V, H] gradients at once, at the moment the full-weight trainer's memory
    peaks (docs/benchmarks.md). Here the looked-up rows are a leaf of their own, so autograd
    gives the weight the LM head's gradient alone, and the hook adds the rows' gradient to it:
    the same sum, with one [V, H] gradient.
    """
    weight = embedding.weight
    rows = F.embedding(input_ids, weight.detach(), embedding.padding_idx).requires_grad_()
    flat_ids = input_ids.flatten()
    counted = flat_ids != (-1 if embedding.padding_idx is None else embedding.padding_idx)
    ids = flat_ids[counted]  # nn.Embedding gives the padding row no gradient

    def add_rows(grad: Tensor) -> None:
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        flat = grad.flatten(0, -2)[counted].to(weight.dtype)
        weight.grad.index_put_((ids,), flat, accumulate=True)

    rows.register_hook(add_rows)
    return rows


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (`model.layers` in Llama/Qwen-style models)."""
    layers = getattr(getattr(lm, "model", None), "layers", None)
    if layers is None:
        raise UsageError(f"{type(lm).__name__}: cannot find decoder layers at .model.layers")
    return list(layers)


def stored_dtype(hf_config: Any) -> torch.dtype:
    """The dtype of the checkpoint's tensors, as its config.json records it (fp32 if unsaid)."""
    dtype = getattr(hf_config, "dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def compute_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.dtype)


FLASH = ("flash_attention_3", "flash_attention_2")


def flash_available(name: str) -> bool:
    """Whether transformers can run `name` here (the flash-attn package for it is installed)."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    return (
        is_flash_attn_3_available()
        if name == "flash_attention_3"
        else (is_flash_attn_2_available())
    )


def attention_implementation(cfg: ModelConfig, device: torch.device) -> str:
    """The attention kernel: `auto` = varlen flash attention on GPU when installed (packed rows
    become cu_seqlens from the position_ids restarts), else sdpa with the block-causal mask."""
    if cfg.attention == "auto":
        if device.type == "cuda":
            return next((name for name in FLASH if flash_available(name)), "sdpa")
        return "sdpa"
    if cfg.attention in FLASH:
        if device.type != "cuda":
            raise UsageError(f"model.attention = {cfg.attention!r} needs a GPU; use sdpa on CPU")
        if not flash_available(cfg.attention):
            raise UsageError(
                f"model.attention = {cfg.attention!r}: its flash-attn package is not installed"
            )
    return cfg.attention


def _from_pretrained(cfg: ModelConfig, **kwargs: Any) -> nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(cfg.path, **kwargs)
    except OSError as exc:
        raise UsageError(f"cannot load model.path {cfg.path!r}: {exc}") from exc


def keeps_root_stored(lm: nn.Module) -> bool:
    """Whether FSDP2's root group (what the decoder layers leave: the embeddings and the LM
    head, tied or not) is all frozen, so it can stay in its stored dtype when unsharded.

    The root's unsharded parameters are held from forward to backward; cast to an fp32
    compute dtype, a real vocabulary's embedding alone is a large share of a LoRA trainer's
    memory (docs/benchmarks.md), kept bf16 it is half that. The computation does not change:
    the embeddings' output is cast to the compute dtype (exact), the LM head's logits are
    computed from a block of upcast vocabulary rows at a time (`chunked_logprobs`), and the
    final norm gets its own group with the layers' casting policy (`load_policy`).
    """
    norm = getattr(getattr(lm, "model", None), "norm", None)
    embeddings = getattr(getattr(lm, "model", None), "embed_tokens", None)
    if not isinstance(norm, nn.Module) or not isinstance(embeddings, nn.Module):
        return False
    in_groups = {id(p) for m in [*decoder_layers(lm), norm] for p in m.parameters()}
    root = [p for p in lm.parameters() if id(p) not in in_groups]
    return not any(p.requires_grad for p in root)


def load_policy(
    cfg: ModelConfig,
    device: torch.device,
    chunk_size: int,
    mesh: DeviceMesh | None = None,
    context: cp.ContextGroup | None = None,
) -> PolicyModel:
    """Build the model on the meta device, shard it with FSDP2, then fill each rank's shards.

    With `model.lora`, peft's LoRA layers are injected first (base frozen, see
    `rlkit.trainer.lora`), so FSDP2 shards base and adapter together.
    Only rank 0 reads the checkpoint (in its stored dtype); the full state dict is broadcast and
    every rank keeps just its fp32 shards, so no rank but 0 ever holds the whole model, and
    rank 0 only in the checkpoint's dtype, one decoder layer resident at a time
    (`rlkit.trainer.rank0_load`). Buffers (rotary tables) come from rank 0 as well.
    `mesh`: None shards over all ranks; a 2-D (replicate, shard) mesh is HSDP.
    `context` of size > 1: attention is `rlkit.trainer.context_parallel`'s (rows split across
    the ranks of a context group), and, where `vocab_parallel.supported`, the embeddings and
    LM head are one FSDP2 group of their own that no forward unshards: the policy computes with
    each rank's vocabulary slice of it (`rlkit.trainer.vocab_parallel`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if not cfg.path:
        raise UsageError("model.path is empty: set it to a local HF model directory or HF name")
    if Path(cfg.path).exists() and not (Path(cfg.path) / "config.json").is_file():
        raise UsageError(f"model.path {cfg.path}: no config.json (not an HF model directory)")
    attn = attention_implementation(cfg, device)
    context_parallel = context.size if context is not None else 1
    if context_parallel > 1:
        if cfg.attention not in ("auto", "sdpa"):
            raise UsageError(
                f"model.attention = {cfg.attention!r}: trainer.context_parallel > 1 runs its own "
                "attention (sdpa with the split rows' masks); set model.attention = 'auto'"
            )
        cp.register_attention()
        attn = cp.ATTENTION
    source = _from_pretrained(cfg, dtype="auto", attn_implementation="sdpa") if is_main() else None
    hf_config = AutoConfig.from_pretrained(cfg.path)
    stored = stored_dtype(hf_config)  # before from_config, which sets the config's dtype
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(
            hf_config, dtype=torch.float32, attn_implementation=attn
        )
        if cfg.lora.enabled:
            add_lora(lm, cfg.lora)
            store_frozen_in(lm, stored)
    if cfg.lora.enabled and source is not None:  # rank 0 draws the initial A (B = 0) for all
        add_lora(source, cfg.lora)
    lm.config.use_cache = False
    if cfg.activation_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    dtype = compute_dtype(cfg, device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    one_rank = mesh is None and world_size() == 1
    for layer in decoder_layers(lm):
        _shard(layer, mp, mesh, one_rank)
    split_vocab = context_parallel > 1 and vp.supported(lm, mesh is None)
    policy = PolicyModel(lm, chunk_size, context if split_vocab else None, dtype)
    root_mp = mp
    if dtype != stored and keeps_root_stored(lm):
        _shard(lm.model.norm, mp, mesh, one_rank)
        lm.model.embed_tokens.register_forward_hook(lambda _m, _i, out: out.to(dtype))
        root_mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    if split_vocab:  # sharded like the root, never unsharded: PolicyModel takes slices of it
        fully_shard([lm.model.embed_tokens, lm.get_output_embeddings()], mp_policy=root_mp)
    _shard(policy, root_mp, mesh, one_rank)
    policy.to_empty(device=device)
    lm.tie_weights()  # to_empty gives each plain (unsharded) parameter its own storage
    _broadcast_buffers(lm, source, device)
    full = {f"lm.{k}": v for k, v in source.state_dict().items()} if source is not None else {}
    if source is not None:  # rank 0 exports: keep the checkpoint's generation defaults
        lm.generation_config = source.generation_config
    del source
    load_from_rank0(policy, full)
    return policy


def _shard(
    module: nn.Module, mp: MixedPrecisionPolicy, mesh: DeviceMesh | None, one_rank: bool
) -> None:
    """`fully_shard(module)`: its parameters not yet in a group of a submodule become one FSDP2
    group, unsharded (and cast to `mp.param_dtype`) for its forward and backward.

    On one rank a group that needs no cast is left out instead (`ignored_params`): there FSDP2
    would only copy it. It keeps an unsharded copy of each parameter beside the one-rank
    "shard", and after the backward copies each gradient twice through its reduce-scatter; the
    root group's real-vocabulary embedding made that the largest part of the full-weight
    trainer's peak over AdamW's 16 bytes per parameter (docs/benchmarks.md). Left out, the
    parameters are plain tensors that autograd accumulates gradients into, as in a
    single-device torchtitan run; the trainer reads them through `dist.whole`.
    """
    taken = {
        id(p)
        for sub in module.modules()
        if sub is not module and isinstance(sub, FSDPModule)
        for p in sub.parameters()
    }
    own = [p for p in module.parameters() if id(p) not in taken]
    no_cast = mp.param_dtype is None or all(p.dtype == mp.param_dtype for p in own)
    if one_rank and no_cast:
        if taken:  # the submodules' groups still need a root above them
            fully_shard(module, mp_policy=mp, mesh=mesh, ignored_params=set(own))
        return
    fully_shard(module, mp_policy=mp, mesh=mesh)


def load_reference(
    cfg: ModelConfig,
    device: torch.device,
    chunk_size: int,
    mesh: DeviceMesh | None = None,
    context: cp.ContextGroup | None = None,
) -> PolicyModel:
    """A frozen, sharded copy of the initial policy (without any LoRA adapter): the reference
    model whose logprobs the KL penalty (`loss.params.kl_coef`) compares with, as in TRL and
    verl. It costs a second copy of the weights, no optimiser state and one no-grad forward per
    micro-batch."""
    ref = load_policy(
        cfg.model_copy(update={"lora": LoraConfig(), "activation_checkpointing": False}),
        device,
        chunk_size,
        mesh,
        context,
    )
    ref.requires_grad_(False)
    return ref.eval()


def _broadcast_buffers(lm: nn.Module, source: nn.Module | None, device: torch.device) -> None:
    """Copy every buffer (persistent or not, e.g. rotary inv_freq) from rank 0's loaded model."""
    import torch.distributed as tdist

    loaded = dict(source.named_buffers()) if source is not None else {}
    for name, buf in lm.named_buffers():
        if source is not None:
            buf.copy_(loaded[name].to(device=device, dtype=buf.dtype))
        if world_size() > 1:
            tdist.broadcast(buf, src=0)
