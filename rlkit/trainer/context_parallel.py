"""Context parallelism (`[trainer] context_parallel = N`): one packed row's tokens split across
the N ranks of a context group, so a rank holds the activations of 1/N of every sequence.

**Mesh.** The trainer's W ranks form a (data-parallel x context-parallel) grid, W = D x N, with
rank = d * N + c: the N ranks of a context group are consecutive (one node, where possible).
Micro-batches go round robin over the D data-parallel groups; every rank of a context group
runs the same micro-batch, each on its own part of every row. FSDP2 still shards parameters over
all W ranks (the flattened grid; `sharding = "hybrid"` is unchanged). The embeddings and the LM
head are not gathered whole: each rank of a group computes with its slice of the vocabulary
(`rlkit.trainer.vocab_parallel`; with `sharding = "full"` and a plain embedding and head).

**Split.** A row of L tokens is padded to Lp, a multiple of 2N (padding continues the last
sample's positions after every real token, so no real token sees it), and cut into 2N chunks of
c = Lp / 2N tokens; rank r takes chunk r and its mirror 2N-1-r, so under the causal mask every
rank has the same attention work ((2N+1) c^2 query-key pairs). Each token keeps its position id
within its sample (rotary embeddings are per token) and its sample's document id, taken over the
whole row (a new document wherever the position ids do not go up by one, as transformers does).

**Attention.** A transformers attention function registered as `rlkit_context_parallel`
(`AttentionInterface.register`): each layer all-gathers K and V of the group (after rotary, before
GQA's repeat) and puts them in row order. The gather is an autograd function: its backward
reduce-scatters dK and dV to their owners. Each local query chunk x is cut where documents begin
(`attention_plan`, built once per forward for all layers); each piece attends, through a flash
kernel that returns the log-sum-exp, to its own keys with `is_causal` and, where its document
began before the chunk, to that document's earlier keys unmasked; the two are merged by
log-sum-exp (`_BlockAttention`, whose backward runs each block's flash backward against the
merged output and log-sum-exp: the exact gradient). So causal and packed (block-diagonal) rows
are exact without a mask or a score matrix, and K/V go to the kernel unrepeated (it takes GQA's
fewer heads).
Costs per layer and rank, for a row of L tokens, H_kv x D key/value width, b bytes per element:
- memory: the gathered K and V, 2 L H_kv D b, kept for backward (the only activation that does
  not shrink with N); the kernel's per-thread score blocks are O(block x L), not O(L^2);
- communication: forward an all-gather of 2 (N-1)/N L H_kv D b received, backward a
  reduce-scatter of the same volume; plus, per micro-batch, a sum of the [S, T] per-token
  logprobs and entropies (two floats per token).
The LSE kernel is CPU's (`torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`, gloo);
elsewhere (GPU, NCCL) and with dropout, attention falls back to sdpa per local chunk over keys
[0, (x+1) c) with an additive mask `key index <= query index and same document` (built once per
forward, (2N+1) L^2 / 4N^2 elements) and K/V repeated for GQA: exact, but the mask and, where sdpa
picks its math path, the scores are materialised. GPU kernels with the log-sum-exp (flash or
efficient attention, or flash-attention's varlen) are not wired in yet.

**Per-token outputs.** Each rank gets the logprobs and entropies of the targets it holds (with
the vocabulary split, the group computes them together: `vocab_parallel.logprobs`);
`sum_copies` adds the ranks' [S, T] tensors (disjoint entries), and its backward passes each
rank the whole gradient, of which the logprob scatter keeps the rank's own entries. So every rank
of a group computes the loss of whole sequences, the same value, with the unchanged loss code:
token and sequence aggregations (`seq-mean-token-mean`), GSPO's sequence ratio,
`seq_reject_below` and every metric are exact. Each rank's backward carries the gradient of its
own tokens only; FSDP2's average over all W ranks and the trainer's `normalizer / W` then give
the gradient of one big batch, as without context parallelism. Loss metrics are counted on the
group's first rank only. The MoE load-balancing loss (`router_aux_loss_coef`) sums its per-expert
routed slots, router probabilities and token counts over the group before taking fractions and
means (`RouterControl.aux_loss(valid, total=sum_copies)`), so every rank has the whole rows' loss;
as it is not divided by W like the policy loss, the trainer scales its gradient by N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist
from torch import Tensor, nn
from torch.nn import functional as F

from rlkit.errors import UsageError
from rlkit.protocol.routing import UNKNOWN

ATTENTION = "rlkit_context_parallel"  # the attention implementation's registered name


@dataclass(frozen=True)
class ContextGroup:
    """This rank's place in the (data-parallel x context-parallel) grid."""

    size: int = 1  # N: ranks that share each row
    rank: int = 0  # this rank's index in its context group
    dp_size: int = 1  # D: data-parallel groups
    dp_rank: int = 0
    group: Any = None  # the context group's process group (None when size = 1)
    dp_group: Any = None  # this rank's data-parallel group (the ranks of its c; None when D = 1)


def mesh_shape(world: int, context_parallel: int) -> tuple[int, int]:
    """(data-parallel, context-parallel) sizes of `world` ranks; a usage error if N does not
    divide the world size."""
    if context_parallel < 1 or world % context_parallel:
        raise UsageError(
            f"trainer.context_parallel = {context_parallel} must divide the trainer's world size "
            f"{world} (nproc_per_node x nnodes)"
        )
    return world // context_parallel, context_parallel


def describe_mesh(world: int, context_parallel: int) -> str:
    """One line saying what the trainer's ranks will form."""
    dp, cp = mesh_shape(world, context_parallel)
    if cp == 1:
        return f"trainer mesh: {world} rank(s), data parallel {dp} (no context parallelism)"
    return (
        f"trainer mesh: {world} rank(s) = data parallel {dp} x context parallel {cp} "
        f"(ranks {{d*{cp}..d*{cp}+{cp - 1}}} share each row; rows padded to a multiple of "
        f"{2 * cp} tokens, {2 * cp} chunks, rank r takes chunks r and {2 * cp - 1}-r); "
        f"FSDP2 shards over all {world}"
    )


def context_group(context_parallel: int, device: torch.device) -> ContextGroup:
    """Build the grid (a collective when N > 1: every rank calls it)."""
    world = tdist.get_world_size() if tdist.is_initialized() else 1
    dp, cp = mesh_shape(world, context_parallel)
    if cp == 1:
        rank = tdist.get_rank() if tdist.is_initialized() else 0
        return ContextGroup(1, 0, dp, rank)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dp, cp), mesh_dim_names=("dp", "cp"))
    rank = tdist.get_rank()
    dp_group = mesh.get_group("dp") if dp > 1 else None
    return ContextGroup(cp, rank % cp, dp, rank // cp, mesh.get_group("cp"), dp_group)


# ---- row layout ---------------------------------------------------------------------------
def padded_length(length: int, size: int) -> int:
    return math.ceil(length / (2 * size)) * 2 * size


def chunks_of(rank: int, size: int) -> tuple[int, int]:
    """The two chunks (in row order) that `rank` of a group of `size` holds."""
    return rank, 2 * size - 1 - rank


def local_columns(length: int, rank: int, size: int) -> Tensor:
    """Row positions (of a row padded to `length`, a multiple of 2 * size) held by `rank`."""
    c = length // (2 * size)
    return torch.cat([torch.arange(x * c, (x + 1) * c) for x in chunks_of(rank, size)])


def document_ids(position_ids: Tensor) -> Tensor:
    """[R, L] sample index of each token of packed rows: a new sample wherever the position ids
    do not go up by one (transformers' `find_packed_sequence_indices`)."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


@dataclass
class RowAttention:
    """What the attention function needs about the rows of one forward: the context group
    (None: unsplit rows), the document id of every token of the whole padded rows, the row
    chunks this rank's queries are, in local order, and their length. Masks are built once and
    kept here for every layer (and for activation checkpointing's recompute)."""

    group: ContextGroup | None
    documents: Tensor  # [R, Lp]
    chunks: tuple[int, ...]
    chunk_len: int
    _masks: dict[tuple, Tensor | None] = field(default_factory=dict, repr=False)
    _plan: list | None = field(default=None, repr=False)

    def plan(self) -> list[list[Block]]:
        """`attention_plan` of these rows, built once for every layer."""
        if self._plan is None:
            self._plan = attention_plan(self)
        return self._plan

    def mask(self, chunk: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """Additive mask [R, 1, c, (chunk+1) c] of query chunk `chunk` against keys
        [0, (chunk+1) c); None where plain `is_causal` is exact (chunk 0, one document)."""
        key = (chunk, dtype, device)
        if key not in self._masks:
            self._masks[key] = self._build(chunk, dtype, device)
        return self._masks[key]

    def _build(self, chunk: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        c = self.chunk_len
        end = (chunk + 1) * c
        docs = self.documents[:, :end].to(device)
        if chunk == 0 and bool((docs == docs[:, :1]).all()):
            return None
        q_docs = docs[:, chunk * c : end]
        q_pos = torch.arange(chunk * c, end, device=device)
        k_pos = torch.arange(end, device=device)
        allowed = (k_pos[None, :] <= q_pos[:, None])[None] & (q_docs[:, :, None] == docs[:, None])
        out = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return out.masked_fill_(~allowed, float("-inf"))[:, None]


def unsplit_rows(position_ids: Tensor) -> RowAttention:
    """Rows that every rank holds whole (e.g. the canary): no exchange, one chunk."""
    return RowAttention(None, document_ids(position_ids), (0,), position_ids.shape[1])


# ---- collectives ----------------------------------------------------------------------------
class _GatherRow(torch.autograd.Function):
    """[B, H, 2c, D] local chunks -> [B, H, 2N c, D] the whole row in row order; backward:
    reduce-scatter of the gradient back to each chunk's owner."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ContextGroup) -> Tensor:
        ctx.group = group
        n, c = group.size, x.shape[2] // 2
        parts = _all_gather(x, group)
        pieces = [None] * (2 * n)
        for r in range(n):
            first, second = chunks_of(r, n)
            pieces[first] = parts[r, :, :, :c]
            pieces[second] = parts[r, :, :, c:]
        return torch.cat(pieces, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        group = ctx.group
        n = group.size
        c = grad.shape[2] // (2 * n)
        per_rank = []
        for r in range(n):
            pieces = [grad[:, :, x * c : (x + 1) * c] for x in chunks_of(r, n)]
            per_rank.append(torch.cat(pieces, dim=2))
        stacked = torch.cat(per_rank)  # the ranks' parts one after another on dim 0
        out = torch.empty(per_rank[0].shape, dtype=grad.dtype, device=grad.device)
        tdist.reduce_scatter_tensor(out, stacked, group=group.group)
        return out, None


def _all_gather(x: Tensor, group: ContextGroup) -> Tensor:
    """[size, *x.shape]: every rank's `x` (gathered on dim 0, as gloo and NCCL both take)."""
    parts = torch.empty((group.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    tdist.all_gather_into_tensor(parts, x.contiguous(), group=group.group)
    return parts.unflatten(0, (group.size, x.shape[0]))


def gather_row(x: Tensor, group: ContextGroup) -> Tensor:
    """Differentiable all-gather of a layer's local K or V (sequence on dim 2), in row order."""
    return _GatherRow.apply(x, group)


class _SumCopies(torch.autograd.Function):
    """Forward: the sum over the group (each rank holds disjoint entries). Backward: the whole
    gradient to every rank, since every rank computes the same loss of the sum."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ContextGroup) -> Tensor:
        out = x.clone()
        tdist.all_reduce(out, group=group.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def sum_copies(x: Tensor, group: ContextGroup) -> Tensor:
    return _SumCopies.apply(x, group) if x.requires_grad else _sum(x, group)


def _sum(x: Tensor, group: ContextGroup) -> Tensor:
    out = x.detach().clone()
    tdist.all_reduce(out, group=group.group)
    return out


def gather_columns(local: Tensor, shard: Shard, group: ContextGroup) -> Tensor:
    """[R, Lloc, ...] per-rank values -> [R, L, ...] the whole rows (no gradient)."""
    parts = _all_gather(local, group)
    rows, lp = local.shape[0], shard.padded_length
    out = torch.empty((rows, lp, *local.shape[2:]), dtype=local.dtype, device=local.device)
    for r in range(group.size):
        out[:, local_columns(lp, r, group.size).to(local.device)] = parts[r]
    return out[:, : shard.length]


# ---- the attention function -------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """One run of an LSE kernel: queries [q0, q1) of the local tokens (of the rows `rows`)
    against keys [k0, k1) of the whole row, causal (a square: q and k the same row positions)
    or unmasked."""

    rows: slice
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def attention_plan(rows: RowAttention) -> list[list[Block]]:
    """The blocks of every query segment (a document's part of a local chunk), each list merged
    by log-sum-exp into that segment's output: the segment's own keys with `is_causal` and,
    where its document began before the chunk, the document's earlier keys unmasked. So no mask
    and no score matrix is built, and packed rows stay exact: a query sees exactly the keys at or
    before it in its own document. Rows with the same document layout share blocks (padded rows,
    one document each: all rows at once); otherwise each row has its own."""
    docs = rows.documents
    r, c = docs.shape[0], rows.chunk_len
    same = bool((docs == docs[:1]).all())
    groups = [(slice(None), docs[0])] if same else [(slice(i, i + 1), docs[i]) for i in range(r)]
    plan = []
    for row_slice, row_docs in groups:
        starts = torch.nonzero(torch.diff(row_docs, prepend=row_docs[:1] - 1)).flatten().tolist()
        for i, chunk in enumerate(rows.chunks):
            lo, hi = chunk * c, (chunk + 1) * c
            begins = [s for s in starts if lo < s < hi]
            doc_start = max(s for s in starts if s <= lo)
            for a, b in zip([lo, *begins], [*begins, hi], strict=True):
                q0, q1 = i * c + a - lo, i * c + b - lo
                blocks = [Block(row_slice, q0, q1, a, b, True)]
                if a == lo and doc_start < lo:
                    blocks.insert(0, Block(row_slice, q0, q1, doc_start, lo, False))
                plan.append(blocks)
    return plan


def _lse_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether attention with its log-sum-exp runs here (CPU: the flash kernel, any float)."""
    return device.type == "cpu"


def _flash(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None):
    """(out [B, H, l, D], logsumexp [B, H, l]); K/V may have fewer heads (GQA)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, scale=scale
    )


def _flash_backward(g, q, k, v, out, lse, causal: bool, scale: float | None):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        g, q, k, v, out, lse, 0.0, causal, scale=scale
    )


class _BlockAttention(torch.autograd.Function):
    """Exact attention of the local queries over the whole row's K/V by blocks, merged with
    log-sum-exp (ring/flash attention's merge). Saves the queries, the gathered K/V (unrepeated:
    the kernel takes GQA's fewer K/V heads), the output and its log-sum-exp; backward runs each
    block's flash backward against the merged output and log-sum-exp, which is the exact
    gradient of the merged softmax."""

    @staticmethod
    def forward(ctx: Any, query, key, value, plan, scale):  # type: ignore[override]
        b, h, n, d = query.shape
        out = torch.empty((b, n, h, d), dtype=query.dtype, device=query.device).transpose(1, 2)
        lse = torch.empty((b, h, n), dtype=torch.float32, device=query.device)
        for blocks in plan:
            first = blocks[0]
            q = query[first.rows, :, first.q0 : first.q1]
            parts = [
                _flash(
                    q, key[x.rows, :, x.k0 : x.k1], value[x.rows, :, x.k0 : x.k1], x.causal, scale
                )
                for x in blocks
            ]
            o, s = parts[0]
            if len(parts) > 1:
                (o1, s1), (o2, s2) = parts
                s = torch.logaddexp(s1, s2)
                o = o1 * (s1 - s).exp()[..., None].to(o1.dtype) + o2 * (s2 - s).exp()[..., None].to(
                    o2.dtype
                )
            out[first.rows, :, first.q0 : first.q1] = o
            lse[first.rows, :, first.q0 : first.q1] = s
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor):  # type: ignore[override]
        query, key, value, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        for blocks in ctx.plan:
            for x in blocks:
                seg = (x.rows, slice(None), slice(x.q0, x.q1))
                keys = (x.rows, slice(None), slice(x.k0, x.k1))
                gq, gk, gv = _flash_backward(
                    grad[seg].contiguous(),
                    query[seg],
                    key[keys],
                    value[keys],
                    out[seg],
                    lse[seg],
                    x.causal,
                    ctx.scale,
                )
                dq[seg] += gq
                dk[keys] += gk
                dv[keys] += gv
        return dq, dk, dv, None, None


def attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    rows: RowAttention | None = None,
    **_kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention signature: query [B, Hq, l, D], key/value [B, Hkv, l, D] of the
    local tokens; returns [B, l, Hq, D]. `rows` (passed down from `PolicyModel.forward`) says
    where the local tokens are in their rows."""
    if rows is None:
        raise RuntimeError(
            f"attention {ATTENTION!r} needs the rows' layout (`rows=`): call the model through "
            "rlkit.trainer.model.PolicyModel"
        )
    if sliding_window:
        raise UsageError("trainer.context_parallel > 1 does not support sliding-window attention")
    if rows.group is not None:
        key, value = gather_row(key, rows.group), gather_row(value, rows.group)
    if dropout == 0.0 and _lse_kernel(query.device, query.dtype):
        out = _BlockAttention.apply(query, key, value, rows.plan(), scaling)
        return out.transpose(1, 2), None
    return _masked_attention(query, key, value, rows, dropout, scaling), None


def _masked_attention(
    query: Tensor, key: Tensor, value: Tensor, rows: RowAttention, dropout: float, scale
) -> Tensor:
    """Devices without an LSE kernel here (GPU, see the module): sdpa per local chunk over keys
    [0, (chunk+1) c) with the chunk's additive mask and K/V repeated for GQA."""
    repeat = query.shape[1] // key.shape[1]
    if repeat > 1:
        key = key.repeat_interleave(repeat, dim=1)
        value = value.repeat_interleave(repeat, dim=1)
    c = rows.chunk_len
    outs = []
    for i, chunk in enumerate(rows.chunks):
        q = query[:, :, i * c : (i + 1) * c]
        end = (chunk + 1) * c
        mask = rows.mask(chunk, query.dtype, query.device)
        outs.append(
            F.scaled_dot_product_attention(
                q,
                key[:, :, :end],
                value[:, :, :end],
                attn_mask=mask,
                dropout_p=dropout,
                is_causal=mask is None,
                scale=scale,
            )
        )
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous()


def register_attention() -> None:
    """Make `ATTENTION` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, attention)


# ---- splitting a micro-batch ------------------------------------------------------------------
@dataclass
class Shard:
    """This rank's part of a micro-batch: model inputs for its columns, its counted targets and
    where their logprobs go in the micro-batch's [S, T] layout."""

    input_ids: Tensor  # [R, Lloc]
    position_ids: Tensor  # [R, Lloc]
    flat_index: Tensor  # [n] into [R * Lloc]
    targets: Tensor  # [n]
    temperatures: Tensor  # [n]
    target_slot: tuple[Tensor, Tensor]  # [n], [n] into [S, T]
    token_mask: Tensor  # [R, Lloc]
    routing: Tensor | None  # [R, Lloc, layers, k]
    rows: RowAttention
    length: int  # L, the rows' length before padding
    padded_length: int  # Lp


def shard_micro_batch(mb: Any, group: ContextGroup) -> Shard:
    """Split `mb` (`rlkit.trainer.packing.MicroBatch`) for `group.rank` (see the module)."""
    n, rank = group.size, group.rank
    rows, length = mb.input_ids.shape
    lp = padded_length(length, n)
    extra = lp - length
    input_ids = F.pad(mb.input_ids, (0, extra))
    steps = torch.arange(1, extra + 1, dtype=mb.position_ids.dtype)
    position_ids = torch.cat([mb.position_ids, mb.position_ids[:, -1:] + steps], dim=1)
    token_mask = F.pad(mb.token_mask, (0, extra), value=False)
    cols = local_columns(lp, rank, n)
    local_of = torch.full((lp,), -1, dtype=torch.long)
    local_of[cols] = torch.arange(cols.numel())
    row, col = mb.flat_index // length, mb.flat_index % length
    where = local_of[col]
    mine = where >= 0
    routing = None
    if mb.routing is not None:
        pad = torch.full((rows, extra, *mb.routing.shape[2:]), UNKNOWN, dtype=mb.routing.dtype)
        routing = torch.cat([mb.routing, pad], dim=1)[:, cols]
    c = lp // (2 * n)
    return Shard(
        input_ids=input_ids[:, cols],
        position_ids=position_ids[:, cols],
        flat_index=row[mine] * cols.numel() + where[mine],
        targets=mb.targets[mine],
        temperatures=mb.temperatures[mine],
        target_slot=(mb.target_slot[0][mine], mb.target_slot[1][mine]),
        token_mask=token_mask[:, cols],
        routing=routing,
        rows=RowAttention(group, document_ids(position_ids), chunks_of(rank, n), c),
        length=length,
        padded_length=lp,
    )
