"""Turn a list of samples into micro-batches of at most `micro_batch_tokens` tokens.

Packed: several whole samples share one row; `position_ids` restart at 0 for every sample, and
transformers derives a block-diagonal causal mask from those restarts (sdpa/eager on CPU, varlen
flash-attention on GPU), so no token attends across a sample boundary. Padded: one sample per
row, right-padded; with a causal mask padding never influences real tokens.

Packed rows pay for attention across the whole row: without a varlen kernel (sdpa, on CPU and
GPU alike) the block-diagonal mask is dense, so a row of L tokens costs L^2 attention pairs
however short its samples are. `packing="auto"` builds both layouts and keeps the cheaper by
`layout_cost` (on the demo's short samples padded rows win on CPU: bench_train_throughput.py,
figures in docs/benchmarks.md).

Only the positions whose next token counts (loss mask 1) are kept for the LM head, so prompt,
environment and padding tokens cost no vocabulary projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rlkit.errors import UsageError
from rlkit.protocol.routing import UNKNOWN


@dataclass
class TokenSequence:
    """One training sequence as the trainer sees it (RL sample or SFT conversation)."""

    token_ids: list[int]
    loss_mask: list[int]
    inference_logprobs: list[float]
    advantage: float = 0.0
    temperature: float = 1.0  # sampling temperature: logits are divided by it
    routing: Tensor | None = None  # [T, moe_layers, top_k] expert ids, UNKNOWN where not known


@dataclass
class MicroBatch:
    """Model inputs for one forward pass plus per-sample targets laid out as [S, T-1]."""

    input_ids: Tensor  # [R, L]
    position_ids: Tensor  # [R, L]
    flat_index: Tensor  # [N] row-major index into [R*L] of the hidden state predicting a target
    targets: Tensor  # [N] next-token ids at counted positions
    temperatures: Tensor  # [N] sampling temperature of each target's sample
    target_slot: tuple[Tensor, Tensor]  # ([N] sample index, [N] shifted position) into [S, T-1]
    loss_mask: Tensor  # [S, T-1] float
    inference_logprobs: Tensor  # [S, T-1]
    advantages: Tensor  # [S]
    num_tokens: int  # real (non-padding) tokens
    sample_ids: list[int]  # index into the input list of each of the S samples
    token_mask: Tensor  # [R, L] bool: real tokens (not padding)
    routing: Tensor | None = None  # [R, L, moe_layers, top_k] laid out like input_ids
    ref_logprobs: Tensor | None = None  # [S, T-1] the reference model's (loss kl_coef > 0)

    @property
    def shape(self) -> tuple[int, int]:
        return self.loss_mask.shape[0], self.loss_mask.shape[1]


def _bins_packed(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: sample indices grouped so each group's total length <= capacity."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def _bins_padded(lengths: list[int], capacity: int) -> list[list[int]]:
    """Longest first; rows are added while rows * longest <= capacity."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    for i in order:
        if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= capacity:
            bins[-1].append(i)
        else:
            bins.append([i])
    return bins


def _build(seqs: list[TokenSequence], rows: list[list[int]]) -> MicroBatch:
    """Lay out `rows` (each a list of indices into `seqs`) as one micro-batch."""
    order = [i for row in rows for i in row]
    row_len = max(sum(len(seqs[i].token_ids) for i in row) for row in rows)
    n_rows = len(rows)
    input_ids = torch.zeros(n_rows, row_len, dtype=torch.long)
    position_ids = torch.zeros(n_rows, row_len, dtype=torch.long)
    token_mask = torch.zeros(n_rows, row_len, dtype=torch.bool)
    routing = _routing_layout(seqs, order, n_rows, row_len)
    t_max = max(len(seqs[i].token_ids) for i in order) - 1
    loss_mask = torch.zeros(len(order), t_max)
    inf_lp = torch.zeros(len(order), t_max)
    advantages = torch.tensor([seqs[i].advantage for i in order], dtype=torch.float32)
    flat, targets, temps, slot_s, slot_t = [], [], [], [], []
    s = 0
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            seq = seqs[i]
            n = len(seq.token_ids)
            input_ids[r, start : start + n] = torch.tensor(seq.token_ids)
            token_mask[r, start : start + n] = True
            if routing is not None and seq.routing is not None:
                routing[r, start : start + n] = seq.routing
            position_ids[r, start : start + n] = torch.arange(n)
            if start + n < row_len:  # padding continues counting so it is not a new sequence
                position_ids[r, start + n :] = torch.arange(n, n + row_len - start - n)
            mask = torch.tensor(seq.loss_mask[1:], dtype=torch.float32)
            loss_mask[s, : n - 1] = mask
            inf_lp[s, : n - 1] = torch.tensor(seq.inference_logprobs[1:], dtype=torch.float32)
            pos = mask.nonzero().squeeze(1)
            flat.append(r * row_len + start + pos)
            targets.append(torch.tensor(seq.token_ids, dtype=torch.long)[1:][pos])
            temps.append(torch.full(pos.shape, seq.temperature, dtype=torch.float32))
            slot_s.append(torch.full_like(pos, s))
            slot_t.append(pos)
            start += n
            s += 1
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        flat_index=torch.cat(flat),
        targets=torch.cat(targets),
        temperatures=torch.cat(temps),
        target_slot=(torch.cat(slot_s), torch.cat(slot_t)),
        loss_mask=loss_mask,
        inference_logprobs=inf_lp * loss_mask,
        advantages=advantages,
        num_tokens=sum(len(seqs[i].token_ids) for i in order),
        sample_ids=order,
        token_mask=token_mask,
        routing=routing,
    )


def layout_cost(lengths: list[int], bins: list[list[int]], packed: bool, hidden: int) -> float:
    """Estimated compute of a layout, in token-equivalents: every token slot (padding too)
    costs ~12*hidden^2 flops in the projections and MLP, every attention pair ~hidden."""
    total = 0.0
    for group in bins:
        rows = [sum(lengths[i] for i in group)] if packed else [max(lengths[i] for i in group)]
        width = rows[0]
        n_rows = 1 if packed else len(group)
        total += n_rows * (width + width * width / (12 * hidden))
    return total


def _routing_layout(
    seqs: list[TokenSequence], order: list[int], rows: int, length: int
) -> Tensor | None:
    """An all-UNKNOWN [rows, length, layers, k] routing tensor when any sample has routing."""
    given = [seqs[i].routing for i in order if seqs[i].routing is not None]
    if not given:
        return None
    for i in order:
        r, n = seqs[i].routing, len(seqs[i].token_ids)
        if r is not None and (r.shape[0] != n or r.shape[1:] != given[0].shape[1:]):
            raise ValueError(
                f"sample {i}: routing has shape {tuple(r.shape)}, expected "
                f"({n}, {', '.join(map(str, given[0].shape[1:]))})"
            )
    return torch.full((rows, length, *given[0].shape[1:]), UNKNOWN, dtype=torch.long)


def make_micro_batches(
    seqs: list[TokenSequence],
    micro_batch_tokens: int,
    packing: bool | Literal["auto"] = True,
    hidden_size: int = 1024,
) -> list[MicroBatch]:
    """Split `seqs` into micro-batches; deterministic for the same input.

    `packing="auto"` picks packed or padded by `layout_cost` with the model's `hidden_size`.
    """
    lengths = [len(s.token_ids) for s in seqs]
    for i, n in enumerate(lengths):
        if n > micro_batch_tokens:
            raise UsageError(
                f"sample {i} has {n} tokens, more than micro_batch_tokens={micro_batch_tokens}; "
                "raise micro_batch_tokens or shorten the data (max_seq_len)"
            )
    packed = _bins_packed(lengths, micro_batch_tokens)
    padded = _bins_padded(lengths, micro_batch_tokens)
    if packing == "auto":
        cost_packed = layout_cost(lengths, packed, True, hidden_size)
        packing = cost_packed <= layout_cost(lengths, padded, False, hidden_size)
    if packing:
        return [_build(seqs, [group]) for group in packed]
    return [_build(seqs, [[i] for i in group]) for group in padded]
