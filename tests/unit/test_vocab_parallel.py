"""Vocabulary parallelism (rlkit.trainer.vocab_parallel): on 2 and 4 gloo ranks (context groups of
2: D = 1 and D = 2 data-parallel groups), with the embedding and LM head (tied and untied) one
FSDP2 group that is never unsharded, the split lookup and the split logprobs give, for rows cut
across the ranks of each group, the dense computation's logprobs, entropies and every
parameter's gradient (after FSDP2's reduction), over two accumulated micro-batches, a vocabulary
of 13 rows (uneven shards: 7 + 6 over 2 ranks, 4 + 4 + 4 + 1 over 4), per-target temperatures,
a padding id and ranks with different numbers of targets.

The file is also the rank script: `torchrun ... THIS OUT` saves each rank's results to OUT.<rank>.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from rlkit.trainer.logprobs import naive_logprobs
from tests.helpers.torchrun import run_on_ranks

VOCAB, HIDDEN, ROWS, LENGTH, PAD = 13, 6, 2, 8, 1
CHUNK = 3  # row chunks of the head: several per micro-batch
MICRO_BATCHES = 2


class Tiny(nn.Module):
    """Embedding -> a per-token layer -> LM head: every token's output depends on its own input
    only, so any split of the rows is exact without an attention exchange."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN, padding_idx=PAD)
        self.mid = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids, flat_index, targets, temps, group=None) -> tuple[Tensor, Tensor]:
        from rlkit.trainer import vocab_parallel as vp

        if group is None:
            hidden = torch.tanh(self.mid(self.embed(ids))).flatten(0, 1)[flat_index]
            return naive_logprobs(hidden, self.head.weight, targets, temps, with_entropy=True)
        head = vp.take(self.head.weight, group)
        table = head if self.embed.weight is self.head.weight else vp.take(self.embed.weight, group)
        hidden = torch.tanh(self.mid(vp.embed(ids, table, PAD))).flatten(0, 1)[flat_index]
        return vp.logprobs(hidden, head, targets, CHUNK, temps, with_entropy=True)


def batch(d: int, j: int) -> dict[str, Tensor]:
    """Micro-batch j of data-parallel group d: ids with padding, counted positions (uneven over
    the ranks), their targets, temperatures and loss weights."""
    g = torch.Generator().manual_seed(10 * d + j)
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=g)
    ids[0, 2] = ids[1, 5] = PAD
    counted = torch.rand(ROWS * LENGTH, generator=g) < 0.7
    counted[:3] = True
    flat_index = torch.nonzero(counted).flatten()
    n = flat_index.numel()
    return {
        "ids": ids,
        "flat_index": flat_index,
        "targets": torch.randint(0, VOCAB, (n,), generator=g),
        "temps": 0.5 + torch.rand(n, generator=g),
        "weights": torch.randn(n, generator=g),
    }


def dense(tied: bool, groups: int) -> dict:
    """One process: every group's micro-batches on the whole rows; the gradient of the sum of
    their losses (what the trainer's ranks together compute)."""
    model = Tiny(tied)
    out: dict = {"lp": {}, "ent": {}}
    for d in range(groups):
        for j in range(MICRO_BATCHES):
            b = batch(d, j)
            lp, ent = model(b["ids"], b["flat_index"], b["targets"], b["temps"])
            (b["weights"] * lp).sum().backward()
            out["lp"][d, j], out["ent"][d, j] = lp.detach(), ent
    out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out


def rank_main(out: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.fsdp import fully_shard

    from rlkit.trainer import context_parallel as cp
    from rlkit.trainer import dist

    dist.init_distributed()
    group = cp.context_group(2, torch.device("cpu"))
    world = tdist.get_world_size()
    results = {}
    for tied in (False, True):
        model = Tiny(tied)
        fully_shard([model.embed, model.head])
        fully_shard(model)
        assert (model.embed.weight is model.head.weight) == tied
        cols = cp.local_columns(LENGTH, group.rank, group.size)
        local_of = torch.full((LENGTH,), -1)
        local_of[cols] = torch.arange(cols.numel())
        lps, ents = {}, {}
        for j in range(MICRO_BATCHES):
            b = batch(group.dp_rank, j)
            row, col = b["flat_index"] // LENGTH, b["flat_index"] % LENGTH
            mine = local_of[col] >= 0
            local_index = row[mine] * cols.numel() + local_of[col][mine]
            lp, ent = model(
                b["ids"][:, cols], local_index, b["targets"][mine], b["temps"][mine], group
            )
            # as the trainer: own entries into the whole layout, summed over the group, the loss
            # scaled by W (FSDP2 averages the gradients over the W ranks)
            slot = torch.nonzero(mine).flatten()
            whole_lp = cp.sum_copies(torch.zeros(mine.shape).index_put((slot,), lp), group)
            whole_ent = cp.sum_copies(torch.zeros(mine.shape).index_put((slot,), ent), group)
            (world * (b["weights"] * whole_lp).sum()).backward()
            lps[j], ents[j] = whole_lp.detach(), whole_ent
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        results[tied] = {"lp": lps, "ent": ents, "grads": grads, "dp_rank": group.dp_rank}
    torch.save(results, f"{out}.{tdist.get_rank()}")
    dist.close_distributed(wait_for_peers=True)


@pytest.mark.slow  # torchrun with 2 and 4 processes
@pytest.mark.parametrize("ranks", [2, 4])
def test_split_vocabulary_matches_the_dense_computation(ranks: int, tmp_path: Path) -> None:
    out = tmp_path / "ranks.pt"
    run_on_ranks(__file__, ranks, str(out))
    groups = ranks // 2
    for tied in (False, True):
        want = dense(tied, groups)
        for r in range(ranks):
            got = torch.load(f"{out}.{r}")[tied]
            d = got["dp_rank"]
            for j in range(MICRO_BATCHES):
                # fp32, a few terms (13 logits, 6 hidden): rounding only
                torch.testing.assert_close(got["lp"][j], want["lp"][d, j], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(got["ent"][j], want["ent"][d, j], rtol=1e-5, atol=1e-6)
            assert got["grads"].keys() == want["grads"].keys()
            for name, grad in want["grads"].items():
                assert grad.abs().max() > 0, name
                torch.testing.assert_close(got["grads"][name], grad, rtol=1e-5, atol=1e-6)
        # the padding row gets the head's gradient alone (tied) or none (untied embedding)
        if not tied:
            assert not want["grads"]["embed.weight"][PAD].any()


def test_supported_needs_a_plain_embedding_and_head_sharded_over_all_ranks() -> None:
    from types import SimpleNamespace

    from rlkit.trainer.vocab_parallel import supported

    def lm(embed: nn.Module, head: nn.Module) -> nn.Module:
        model = nn.Module()
        model.model = SimpleNamespace(embed_tokens=embed)
        model.get_output_embeddings = lambda: head
        return model

    plain = lm(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    assert supported(plain, sharded_over_world=True)
    assert not supported(plain, sharded_over_world=False)  # hybrid sharding
    assert not supported(lm(nn.Embedding(5, 3), nn.Linear(3, 5)), True)  # a biased head

    class Scaled(nn.Embedding):
        pass

    assert not supported(lm(Scaled(5, 3), nn.Linear(3, 5, bias=False)), True)


if __name__ == "__main__":
    rank_main(sys.argv[1])
