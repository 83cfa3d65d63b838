"""Vocabulary parallelism inside a context group (`context_parallel = N > 1`): the embedding and
the LM head are never gathered whole. Megatron's vocab-parallel embedding and cross-entropy, on
FSDP2's own shards.

**Why.** FSDP2 gathers a parameter group whole for its forward and backward. For a real
vocabulary that is the largest tensor of a small model (151,936 x 1,024 at qwen3-0.6b: 0.58 GiB in
fp32), and it was gathered beside its whole gradient and the head's [chunk, V] logits: ~1.7 GiB a
rank that context parallelism did not split (docs/benchmarks.md). In a context group the ranks
hold different tokens of the same rows, so they can split the vocabulary instead of each holding
all of it.

**Slices.** With `trainer.sharding = "full"` FSDP2 shards each weight's rows over all W = D x N
ranks: rank w = d N + c holds chunk w of ceil(V / W) rows. The vocabulary group (the embedding
and the LM head, one FSDP2 group of their own, see `rlkit.trainer.model.load_policy`) is never
unsharded: rank (d, c) takes as its slice its own chunk and those of the ranks with the same c in
the other data-parallel groups (an all-gather over the D ranks of its data-parallel group; none
when D = 1), chunks d' N + c for every d': V / N rows, every vocabulary row in exactly one slice of
each context group. The slice's gradient is reduce-scattered back over those D ranks and divided
by W, which is what FSDP2's reduce-scatter would have left in each shard, so the optimiser,
clipping, checkpoints and weight export see the same sharded parameter and gradient as before.

**Embedding.** The group's ranks all-gather their token ids, each looks up the ones in its slice
(zeros elsewhere), and a reduce-scatter sums the group's lookups and hands each rank its own
tokens: [group tokens, H] per rank, not [V, H]. Backward: an all-gather of the rows' gradient,
added into the slice's rows (the padding id's row gets none, as `nn.Embedding` gives it).

**Head.** The ranks all-gather the final hidden states of their counted targets ([targets, H],
padded to the largest rank's count) and each computes, for the group's targets, the logits of
its slice in row chunks: [chunk, V / N] fp32 at a time. Per target each rank keeps its slice's
log-sum-exp, the target's logit where the slice holds the target, and sum(p_slice * logit) for
the entropy; one all-gather of those three numbers per target combines them: log-sum-exp over the
slices, the target's logit from its owner, entropy = lse - sum_slices exp(lse_slice - lse) x the
slice's sum. Backward recomputes the chunks' logits from the saved hidden states and the global
log-sum-exp, adds into the slice's gradient, and reduce-scatters the partial hidden-state
gradients (each rank's covers its slice's columns) back to their owners. Exact: only the order
of floating-point sums changes.

Cost per micro-batch and rank, for T tokens a group (T / N a rank), n counted targets: memory
[T, H] (the lookups, transient) and [n, H] (the gathered hidden states, kept for backward) instead
of [V, H] twice and [chunk, V]; communication the ids, the [n, H] hidden states and their
gradient, the lookups' [T, H] reduce-scatter and all-gather, and 3 floats a target; plus, when
D > 1, the slice's all-gather and its gradient's reduce-scatter over D ranks (V / N rows: what
FSDP2 moved for the whole vocabulary over W ranks, N times smaller). The head's work per rank is
the group's targets x V / N: the same as each rank's own targets x V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard
from torch.nn import functional as F

from rlkit.trainer.context_parallel import ContextGroup
from rlkit.trainer.logprobs import (
    ENTROPY_ROWS,
    Temperature,
    _check_inputs,
    _fp32_logits,
    _rows,
    _times_weight,
)


def supported(lm: nn.Module, sharded_over_world: bool) -> bool:
    """Whether `lm`'s vocabulary can be split over a context group: a plain embedding, a plain
    bias-free linear head (tied or not), and parameters sharded by FSDP2 over all ranks (not
    hybrid sharding, whose replicas would need one more reduction)."""
    embedding = getattr(getattr(lm, "model", None), "embed_tokens", None)
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    return (
        sharded_over_world
        and type(embedding) is nn.Embedding  # not a subclass that scales or adds to the lookup
        and type(head) is nn.Linear
        and head.bias is None
    )


def _gather(x: Tensor, group: Any, size: int) -> Tensor:
    """[size * x.shape[0], ...]: every rank's `x` of `group`, one after another."""
    out = torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    tdist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _reduce_scatter(x: Tensor, group: Any, size: int) -> Tensor:
    """The sum over `group` of `x` ([size * m, ...]), this rank's m rows."""
    out = torch.empty((x.shape[0] // size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    tdist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


@dataclass(frozen=True)
class _Layout:
    """Where this rank's vocabulary slice comes from (see the module)."""

    vocab: int  # V
    world: int  # W, the ranks FSDP2 shards over
    chunk: int  # ceil(V / W), FSDP2's rows a rank
    chunks: tuple[int, ...]  # the FSDP2 chunks of the slice, in slice order (ranks d' N + c)
    dp_rank: int  # this rank's place among them
    dp_group: Any  # their process group (None when D = 1)

    def span(self, k: int) -> tuple[int, int]:
        """Rows [lo, hi) of FSDP2 chunk k (torch.chunk's: the last ones short or empty)."""
        return min(k * self.chunk, self.vocab), min((k + 1) * self.chunk, self.vocab)


def _layout(weight: DTensor, group: ContextGroup) -> _Layout:
    mesh = weight.device_mesh
    if mesh.ndim != 1 or tuple(weight.placements) != (Shard(0),):
        raise RuntimeError(f"vocabulary parallel needs rows sharded over all ranks, not {weight}")
    world, rank = mesh.size(), mesh.get_local_rank()
    if world != group.size * group.dp_size or rank != group.dp_rank * group.size + group.rank:
        raise RuntimeError("the vocabulary's FSDP2 mesh is not the (dp x cp) grid's ranks")
    vocab = weight.shape[0]
    chunks = tuple(d * group.size + group.rank for d in range(group.dp_size))
    return _Layout(vocab, world, math.ceil(vocab / world), chunks, group.dp_rank, group.dp_group)


class _Slice(torch.autograd.Function):
    """This rank's FSDP2 shard -> its vocabulary slice (an all-gather over the data-parallel
    group when D > 1); backward: the slice's gradient reduce-scattered to the shards and divided
    by W, which is what FSDP2's reduce-scatter leaves in a shard."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, layout: _Layout) -> Tensor:  # type: ignore[override]
        ctx.layout = layout
        d = len(layout.chunks)
        if d == 1:
            return local.view_as(local)
        padded = F.pad(local, (0, 0, 0, layout.chunk - local.shape[0]))
        parts = _gather(padded, layout.dp_group, d).unflatten(0, (d, layout.chunk))
        spans = [layout.span(k) for k in layout.chunks]
        return torch.cat([part[: hi - lo] for part, (lo, hi) in zip(parts, spans, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        layout = ctx.layout
        d = len(layout.chunks)
        if d == 1:
            return grad / layout.world, None
        padded = grad.new_zeros((d, layout.chunk, grad.shape[1]))
        start = 0
        for i, (lo, hi) in enumerate(layout.span(k) for k in layout.chunks):
            padded[i, : hi - lo] = grad[start : start + hi - lo]
            start += hi - lo
        mine = _reduce_scatter(padded.flatten(0, 1), layout.dp_group, d)
        lo, hi = layout.span(layout.chunks[layout.dp_rank])
        return mine[: hi - lo] / layout.world, None


@dataclass(frozen=True)
class VocabSlice:
    """This rank's rows of a vocabulary weight, in the autograd graph of its FSDP2 shard."""

    weight: Tensor  # [v, H]
    row_of: Tensor  # [V] int64: each token id's row in `weight`, -1 where another rank has it
    group: ContextGroup


def take(weight: Tensor, group: ContextGroup) -> VocabSlice:
    """The slice of the FSDP2-sharded (never unsharded) `weight` this rank computes with."""
    if not isinstance(weight, DTensor):
        raise RuntimeError("vocabulary parallel: the embedding/LM head group must stay sharded")
    layout = _layout(weight, group)
    rows = _Slice.apply(weight.to_local(), layout)
    row_of = torch.full((layout.vocab,), -1, dtype=torch.long, device=rows.device)
    start = 0
    for lo, hi in (layout.span(k) for k in layout.chunks):
        row_of[lo:hi] = torch.arange(start, start + hi - lo, device=rows.device)
        start += hi - lo
    return VocabSlice(rows, row_of, group)


# ---- embedding ------------------------------------------------------------------------------
class _Embed(torch.autograd.Function):
    """Lookup of the group's tokens in this rank's slice, summed over the group and scattered to
    the tokens' owners; backward: the owners' gradients gathered and added into the slice."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, weight: Tensor, ids: Tensor, vocab: VocabSlice, padding_idx: int | None
    ) -> Tensor:
        group = vocab.group
        every = _gather(ids.flatten(), group.group, group.size)
        rows = vocab.row_of[every]
        mine = rows >= 0
        looked = weight.new_zeros((every.numel(), weight.shape[1]))
        looked[mine] = weight[rows[mine]]
        out = _reduce_scatter(looked, group.group, group.size)
        del looked
        if padding_idx is not None:  # nn.Embedding gives the padding row no gradient
            mine &= every != padding_idx
        ctx.save_for_backward(rows, mine)
        ctx.group, ctx.slice_rows = group, weight.shape[0]
        return out.unflatten(0, ids.shape)

    @staticmethod
    def backward(ctx: Any, grad: Tensor):  # type: ignore[override]
        rows, mine = ctx.saved_tensors
        group = ctx.group
        every = _gather(grad.flatten(0, -2), group.group, group.size)
        out = every.new_zeros((ctx.slice_rows, every.shape[1]))
        out.index_add_(0, rows[mine], every[mine])
        return out, None, None, None


def embed(ids: Tensor, vocab: VocabSlice, padding_idx: int | None = None) -> Tensor:
    """`F.embedding(ids, whole weight)` for this rank's `ids` ([R, L] -> [R, L, H]); every rank
    of the group calls it (a collective)."""
    return _Embed.apply(vocab.weight, ids, vocab, padding_idx)


# ---- logprobs -------------------------------------------------------------------------------
def _padded(x: Tensor, rows: int, value: float = 0) -> Tensor:
    pad = [0, 0] * (x.dim() - 1) + [0, rows - x.shape[0]]
    return F.pad(x, pad, value=value)


def _slice_stats(logits: Tensor, rows: Tensor, with_entropy: bool) -> Tensor:
    """[3, n]: per row the slice's log-sum-exp, the target's logit where the slice holds it (0
    elsewhere), and sum(softmax_slice * logits) (the entropy's term, 0 without entropy)."""
    stats = logits.new_zeros((3, logits.shape[0]))
    lse = torch.logsumexp(logits, dim=-1)
    stats[0] = lse
    held = rows >= 0
    stats[1, held] = logits[held, rows[held]]
    if with_entropy:
        for start in range(0, logits.shape[0], ENTROPY_ROWS):
            end = start + ENTROPY_ROWS
            block = logits[start:end]
            stats[2, start:end] = block.sub(lse[start:end, None]).exp_().mul_(block).sum(-1)
    return stats


class _Logprobs(torch.autograd.Function):
    """See the module: the group's targets against this rank's vocabulary slice."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        vocab: VocabSlice,
        chunk_size: int,
        temperature: Temperature,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        group = vocab.group
        n = hidden.shape[0]
        count = torch.tensor([n], device=hidden.device)
        m = int(_gather(count, group.group, group.size).max())
        every = _gather(_padded(hidden, m), group.group, group.size)
        rows = vocab.row_of[_gather(_padded(targets, m), group.group, group.size)]
        temp = temperature
        if isinstance(temperature, Tensor):
            temp = _gather(_padded(temperature, m, 1.0), group.group, group.size)
        stats = torch.empty((3, every.shape[0]), dtype=torch.float32, device=hidden.device)
        for start in range(0, every.shape[0], chunk_size):
            end = min(start + chunk_size, every.shape[0])
            logits = _fp32_logits(every[start:end], weight, _rows(temp, start, end))
            stats[:, start:end] = _slice_stats(logits, rows[start:end], with_entropy)
            del logits
        parts = _gather(stats, group.group, group.size).unflatten(0, (group.size, 3))
        lse = torch.logsumexp(parts[:, 0], dim=0)
        logprobs = parts[:, 1].sum(0) - lse
        entropy = lse - (parts[:, 0] - lse).exp().mul(parts[:, 2]).sum(0)
        own = slice(group.rank * m, group.rank * m + n)
        ctx.save_for_backward(every, weight, rows, lse)
        ctx.temperature, ctx.group, ctx.m, ctx.n, ctx.chunk_size = temp, group, m, n, chunk_size
        # copies, not views: FSDP2 hooks its pre-backward on the root module's outputs
        entropy = entropy[own].clone() if with_entropy else entropy.new_empty(0)
        ctx.mark_non_differentiable(entropy)
        return logprobs[own].clone(), entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Tensor, _grad_entropy: Tensor):  # type: ignore[override]
        every, weight, rows, lse = ctx.saved_tensors
        group, m, step = ctx.group, ctx.m, ctx.chunk_size
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = _gather(_padded(grad_logprobs.float(), m), group.group, group.size)
        grad_every = torch.empty_like(every) if need_hidden else None
        grad_weight = None
        if need_weight:  # fp32 across chunks, as chunked_logprobs
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, every.shape[0], step):
            end = min(start + step, every.shape[0])
            temp = _rows(ctx.temperature, start, end)
            logits = _fp32_logits(every[start:end], weight, temp)
            gc, held = g[start:end], rows[start:end] >= 0
            grad_logits = logits.sub_(lse[start:end, None]).exp_().mul_(-gc[:, None])
            at = torch.nonzero(held).flatten()
            grad_logits[at, rows[start:end][at]] += gc[at]
            if isinstance(temp, Tensor) or temp != 1.0:
                grad_logits.div_(temp)
            if grad_every is not None:
                grad_every[start:end] = _times_weight(grad_logits, weight, every.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.T, every[start:end].float())
            del logits, grad_logits
        grad_hidden = None
        if grad_every is not None:
            grad_hidden = _reduce_scatter(grad_every, group.group, group.size)[: ctx.n]
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def logprobs(
    hidden: Tensor,
    vocab: VocabSlice,
    targets: Tensor,
    chunk_size: int = 1024,
    temperature: Temperature = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`chunked_logprobs(hidden, whole weight, targets, ...)` for this rank's targets, the
    vocabulary split over the group (a collective: every rank of the group calls it, with its
    own number of targets). Same values and gradients within fp32 rounding."""
    _check_inputs(hidden, vocab.weight, targets, temperature, chunk_size, vocab.row_of.numel())
    out, entropy = _Logprobs.apply(
        hidden, vocab.weight, targets, vocab, chunk_size, temperature, with_entropy
    )
    return out, entropy if with_entropy else None
