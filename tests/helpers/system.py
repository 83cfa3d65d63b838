"""System components the tests need (bubblewrap, chromium, PostgreSQL): skipped locally when
missing, a failure in CI (`CI=true`), so CI can never pass without the tests they gate."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_system(component: str, available: bool, fix: str) -> None:
    """Skip (locally) or fail (CI) the calling test when `component` is not `available`."""
    if available:
        return
    message = f"{component} is not available on this machine: {fix}"
    if in_ci():
        pytest.fail(f"CI=true: a missing system component is a failure, not a skip: {message}")
    pytest.skip(message)
