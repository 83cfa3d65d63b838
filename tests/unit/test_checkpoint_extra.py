"""A checkpoint's RNG and scheduler file (`extra_rank{r}.pt`) loads without pickle: a planted
pickle is refused, not run."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlkit.errors import UsageError
from rlkit.trainer.checkpoint import read_extra, rng_state, set_rng_state
from rlkit.trainer.optim import OptimConfig, build_optimizer
from tests.helpers.planted import Planted


def test_rng_and_scheduler_state_round_trip_as_plain_values(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 4)
    optimizer, scheduler = build_optimizer(model, OptimConfig(), total_steps=10)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = tmp_path / "extra_rank0.pt"
    state = rng_state()
    torch.save(
        {
            "step": 3,
            "scheduler": scheduler.state_dict(),
            "data": {"next_batch": 4},
            "rng": state,
            "world_size": 1,
        },
        path,
    )
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)

    extra = read_extra(path)  # weights_only=True
    set_rng_state(extra["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    _, fresh = build_optimizer(model, OptimConfig(), total_steps=10)
    fresh.load_state_dict(extra["scheduler"])
    assert fresh.get_last_lr() == scheduler.get_last_lr() and extra["data"] == {"next_batch": 4}


def test_a_planted_pickle_is_refused_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "extra_rank0.pt"
    torch.save({"step": 1, "rng": Planted(str(marker))}, path)
    with pytest.raises(UsageError, match="refused unread"):
        read_extra(path)
    assert not marker.exists()
