"""The environment rlkit gives the vLLM servers it starts."""

from __future__ import annotations

import pytest

from rlkit.inference import lifecycle


def test_cpu_servers_skip_vllms_aot_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    monkeypatch.setattr(lifecycle, "has_cuda", lambda: False)
    assert lifecycle.server_env()["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setattr(lifecycle, "has_cuda", lambda: True)  # GPUs: vLLM's default, cache loads
    assert "VLLM_USE_AOT_COMPILE" not in lifecycle.server_env()


def test_the_users_aot_compile_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    monkeypatch.setattr(lifecycle, "has_cuda", lambda: False)
    assert lifecycle.server_env()["VLLM_USE_AOT_COMPILE"] == "1"
