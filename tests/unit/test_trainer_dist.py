"""Process-group set-up errors that would otherwise surface as NCCL's own messages."""

from __future__ import annotations

import pytest
import torch

from rlkit.trainer import dist


def test_a_rank_without_a_gpu_of_its_own_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on a one-GPU node: NCCL would fail with "Duplicate GPU detected"."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match="rank 1 .* CUDA sees 1; set trainer.nproc_per_node"):
        dist.init_distributed()
