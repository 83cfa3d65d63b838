"""Fixtures for the deep-research tests: a temporary RLKIT_HOME (index cache) and the default
environment loaded once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def rlkit_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Every test caches indexes in a temporary RLKIT_HOME, never ~/.rlkit."""
    home = str(tmp_path_factory.mktemp("rlkit-home"))
    old = os.environ.get("RLKIT_HOME")
    os.environ["RLKIT_HOME"] = home
    yield home
    if old is None:
        os.environ.pop("RLKIT_HOME", None)
    else:
        os.environ["RLKIT_HOME"] = old


@pytest.fixture(scope="session")
def world_env(rlkit_home: str) -> Any:
    from rlkit.envs import load_environment

    return load_environment("deep-research", num_train_examples=20)
