"""Muon: the FSDP2-sharded optimiser (rlkit.trainer.muon) steps exactly like torch.optim.Muon on
the hidden matrices plus torch.optim.AdamW on the rest, on one process and on 2 and 4 gloo
ranks, with uneven shards (a 5-row matrix over 4 ranks is split 2, 2, 1, 0).

The file is also the rank script: `torchrun ... THIS OUT` trains `Tiny` for a few steps under
FSDP2 with rlkit's Muon and saves the full parameters and Muon momenta from rank 0 to OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from rlkit.trainer.muon import Muon, assign_owners
from rlkit.trainer.optim import MuonConfig, OptimConfig, build_optimizer, muon_split
from tests.helpers.torchrun import run_on_ranks

STEPS = 3
# What one step sums, on the longest path to an entry: a gradient over the batch's 4 x 7
# tokens, then Newton-Schulz's 5 iterations of 3 matrix products over at most 9 rows; the
# ranks' shards may add these in other orders, and the steps carry the difference on.
TERMS = STEPS * (4 * 7 + 5 * 3 * 9)
OPTIM = OptimConfig(
    name="muon",
    lr=0.01,
    weight_decay=0.1,
    muon=MuonConfig(adamw_params=["embed*", "head*"]),
)


class Tiny(nn.Module):
    """Matrices of 9, 5 and 3 rows (uneven over 2 and 4 ranks), an embedding, a norm, biases."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.a = nn.Linear(6, 9)
        self.b = nn.Linear(9, 5, bias=False)
        self.c = nn.Linear(5, 3)
        self.norm = nn.LayerNorm(3)
        self.head = nn.Linear(3, 11, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.b(torch.tanh(self.a(self.embed(ids)))))
        logits = self.head(self.norm(self.c(h)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(1, 1).flatten())


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, 11, (4, 7), generator=torch.Generator().manual_seed(100 + step))


def make_model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def reference() -> dict[str, torch.Tensor]:
    """torch.optim.Muon + torch.optim.AdamW on one process, no FSDP."""
    model = make_model()
    matrices, other = muon_split(model, OPTIM.muon.adamw_params)
    assert [tuple(p.shape) for p in matrices] == [(9, 6), (5, 9), (3, 5)]
    muon = torch.optim.Muon(
        matrices, lr=OPTIM.lr, weight_decay=OPTIM.weight_decay, adjust_lr_fn="match_rms_adamw"
    )
    adamw = torch.optim.AdamW(other, lr=OPTIM.lr, weight_decay=OPTIM.weight_decay)
    for step in range(STEPS):
        model(batch(step)).backward()
        muon.step()
        adamw.step()
        muon.zero_grad()
        adamw.zero_grad()
    out = {f"param.{n}": full(p) for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    out.update(
        {f"momentum.{names[id(p)]}": full(s["momentum_buffer"]) for p, s in muon.state.items()}
    )
    return out


def rlkit_muon(model: Tiny) -> dict[str, torch.Tensor]:
    """The same steps with rlkit's optimiser (built as the trainer builds it)."""
    optimizer, _ = build_optimizer(model, OPTIM, total_steps=STEPS)
    assert isinstance(optimizer, Muon)
    for step in range(STEPS):
        model(batch(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
    out = {f"param.{n}": full(p) for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        if "momentum_buffer" in state:
            out[f"momentum.{names[id(p)]}"] = full(state["momentum_buffer"])
    return out


def rank_main(out: str) -> None:
    import torch.distributed as tdist
    from torch.distributed.fsdp import fully_shard

    tdist.init_process_group("gloo")
    model = make_model()
    for module in (model.a, model.b, model.c):
        fully_shard(module)
    fully_shard(model)
    result = rlkit_muon(model)
    if tdist.get_rank() == 0:
        torch.save(result, out)
    tdist.barrier()
    tdist.destroy_process_group()


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    from tests.helpers.tolerance import summation_atol  # here: torchrun runs this file alone

    assert got.keys() == want.keys()
    assert sum(k.startswith("momentum.") for k in want) == 3
    for name, value in want.items():
        atol = summation_atol(TERMS, float(value.abs().max()))
        torch.testing.assert_close(got[name], value, rtol=0, atol=atol, msg=name)


def test_one_process_matches_torch_muon_and_adamw() -> None:
    want = reference()
    assert_same(rlkit_muon(make_model()), want)
    assert not torch.equal(want["param.b.weight"], make_model().b.weight.detach())


@pytest.mark.slow  # torchrun with 2 and 4 processes
@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp2_shards_match_one_process(ranks: int, tmp_path: Path) -> None:
    out = tmp_path / "ranks.pt"
    run_on_ranks(__file__, ranks, str(out))
    assert_same(torch.load(out), reference())


def test_owners_balance_newton_schulz_work() -> None:
    shapes = [torch.Size(s) for s in [(8, 8), (8, 8), (2, 2), (16, 8), (2, 2)]]
    # costs m*n*min(m, n): 512, 512, 8, 1024, 8; dealt largest first to the least-loaded rank
    # (lowest on ties): 1024 -> 0, 512 -> 1, 512 -> 1, 8 -> 0 (tie 1024/1024), 8 -> 1
    assert assign_owners(shapes, 2) == [1, 1, 0, 0, 1]
    assert assign_owners(shapes, 1) == [0] * 5


def test_split_takes_only_trainable_parameters() -> None:
    model = make_model()
    model.b.weight.requires_grad_(False)
    model.norm.bias.requires_grad_(False)
    matrices, other = muon_split(model, ["embed*", "head*"])
    assert [tuple(p.shape) for p in matrices] == [(9, 6), (3, 5)]
    ids = {id(p) for p in other}  # identity: `in` on tensors compares values
    assert id(model.norm.bias) not in ids and id(model.head.weight) in ids
    assert id(model.embed.weight) in ids and id(model.a.bias) in ids


def test_muon_refuses_non_matrices() -> None:
    with pytest.raises(ValueError, match="2-D parameters only"):
        Muon([{"params": [nn.Parameter(torch.zeros(3))], "muon": True, "lr": 0.1}])


if __name__ == "__main__":
    rank_main(sys.argv[1])
