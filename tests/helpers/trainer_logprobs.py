"""A few trainer steps, and the trainer's own logprobs of a completion to compare with a
served model's."""

from __future__ import annotations

import torch

from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.sft import sft_loss
from rlkit.trainer.trainer import Trainer


def train_a_little(trainer: Trainer, steps: int = 4) -> None:
    """A few high-lr SFT steps so the exported policy clearly differs from the served one."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(8):
        ids = torch.randint(0, 1000, (24,), generator=g).tolist()
        seqs.append(TokenSequence(ids, [0] * 8 + [1] * 16, [0.0] * 24))
    for _ in range(steps):
        assert not trainer.train_step(seqs, sft_loss, normalizer=8 * 15.0).skipped


def trainer_logprobs(trainer: Trainer, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = prompt + completion
    seq = TokenSequence(ids, [0] * len(prompt) + [1] * len(completion), [0.0] * len(ids))
    (mb,) = make_micro_batches([seq], 4096)
    with torch.no_grad():
        lp, _ = trainer.logprobs(mb)
    return lp[0, len(prompt) - 1 :]
