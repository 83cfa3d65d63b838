"""Sequence packing: capacity and boundaries, and packed == padded == plain HF logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.errors import UsageError
from rlkit.trainer.config import ModelConfig, TrainerConfig
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.trainer import Trainer
from tests.helpers.sequences import sequences
from tests.helpers.tolerance import forward_terms, summation_atol


def test_micro_batches_respect_capacity_and_keep_every_sample() -> None:
    seqs = sequences(100, [30, 5, 17, 12, 9, 40, 3])
    for packing in (True, False):
        mbs = make_micro_batches(seqs, 48, packing)
        ids = sorted(i for mb in mbs for i in mb.sample_ids)
        assert ids == list(range(len(seqs)))
        for mb in mbs:
            assert mb.input_ids.numel() <= 48
            assert mb.num_tokens == sum(len(seqs[i].token_ids) for i in mb.sample_ids)
    packed = make_micro_batches(seqs, 48, True)
    assert len(packed) < len(make_micro_batches(seqs, 48, False))
    row = packed[0]
    starts = (row.position_ids[0] == 0).nonzero().squeeze(1).tolist()
    assert len(starts) == len(row.sample_ids)  # positions restart once per packed sample


def test_auto_packing_picks_the_cheaper_layout() -> None:
    # many equal short samples: padding wastes nothing and avoids one long row's L^2 attention
    short = sequences(100, [40] * 24)
    padded = make_micro_batches(short, 4096, "auto", 128)
    assert [tuple(mb.input_ids.shape) for mb in padded] == [(24, 40)]
    # one long sample among short ones: padded rows would mostly be padding, so pack
    mixed = sequences(100, [400] + [10] * 30)
    auto = make_micro_batches(mixed, 4096, "auto", 128)
    assert [mb.input_ids.shape[0] for mb in auto] == [1]
    assert auto[0].input_ids.shape[1] == 700  # every sample in one packed row


def test_sample_longer_than_micro_batch_names_the_setting() -> None:
    with pytest.raises(UsageError, match="sample 1 has 50 tokens, more than micro_batch_tokens=40"):
        make_micro_batches(sequences(100, [10, 50]), 40)


def reference_logprobs(model_dir: Path, seq: TokenSequence) -> torch.Tensor:
    """Plain HF forward of one sequence, full log-softmax, counted positions only."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([seq.token_ids])
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).squeeze(1)
    return lp[torch.tensor(seq.loss_mask[1:]).bool()]


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_packed_padded_and_plain_forwards_agree(
    arch: str, tiny_model_dir: Path, tiny_moe_model_dir: Path, tmp_path: Path
) -> None:
    model_dir = tiny_model_dir if arch == "dense" else tiny_moe_model_dir
    cfg = TrainerConfig(run_dir=str(tmp_path), model=ModelConfig(path=str(model_dir)))
    trainer = Trainer(cfg, total_steps=1)
    try:
        seqs = sequences(trainer.policy.lm.config.vocab_size, [23, 7, 41, 16, 30])

        def per_sample(packing: bool, capacity: int) -> dict[int, torch.Tensor]:
            out = {}
            for mb in make_micro_batches(seqs, capacity, packing):
                with torch.no_grad():
                    lp, _ = trainer.logprobs(mb)
                for row, i in enumerate(mb.sample_ids):
                    out[i] = lp[row][mb.loss_mask[row].bool()]
            return out

        packed = per_sample(True, 128)
        assert len(make_micro_batches(seqs, 128, True)) == 1  # all five in one row
        padded = per_sample(False, 128)
        alone = per_sample(True, 41)  # capacity 41: the longest sits alone
        # the rows sum attention and projections in other orders: fp32 rounding apart
        terms = forward_terms(trainer.policy.lm.config, keys=128)
        for i in range(len(seqs)):
            atol = summation_atol(terms, float(padded[i].abs().max()))
            torch.testing.assert_close(packed[i], padded[i], rtol=0, atol=atol)
            torch.testing.assert_close(packed[i], alone[i], rtol=0, atol=atol)
        reference = reference_logprobs(model_dir, seqs[2])
        atol = summation_atol(terms, float(reference.abs().max()))
        torch.testing.assert_close(packed[2], reference, atol=atol, rtol=0)
    finally:
        trainer.close()
