"""The trainer's process environment on CPU (`rlkit.train.launcher.trainer_env`)."""

from __future__ import annotations

import pytest

from rlkit.train import launcher


def test_cpu_trainer_waits_passively_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "has_cuda", lambda: False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert launcher.trainer_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert launcher.trainer_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_gpu_trainer_keeps_openmp_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "has_cuda", lambda: True)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert "OMP_WAIT_POLICY" not in launcher.trainer_env()
