"""EvalConfig: sampling precedence and validation."""

from __future__ import annotations

import pytest

from rlkit.config import validate
from rlkit.errors import UsageError
from rlkit.eval import EvalConfig


def test_sampling_precedence_env_defaults_then_flags_then_json() -> None:
    config = EvalConfig(max_tokens=5, temperature=0.3, sampling={"temperature": 0.9, "seed": 1})
    resolved = config.sampling_args({"max_tokens": 64, "top_p": 0.95})
    assert resolved == {"max_tokens": 5, "temperature": 0.9, "top_p": 0.95, "seed": 1}
    assert EvalConfig().sampling_args({"max_tokens": 64}) == {"max_tokens": 64}


def test_invalid_fields_are_named() -> None:
    with pytest.raises(UsageError, match="rollouts_per_example"):
        validate(EvalConfig, {"rollouts_per_example": 0})
    with pytest.raises(UsageError, match="max_concurent"):
        validate(EvalConfig, {"max_concurent": 4})
