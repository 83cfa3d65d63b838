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


def test_cpu_engines_keep_a_1_gib_kv_cache_the_user_can_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(lifecycle, "has_cuda", lambda: False)
    args = lifecycle.default_engine_args("m")
    assert args[args.index("--kv-cache-memory-bytes") + 1] == "1G"
    # a flag instead of vLLM's VLLM_CPU_KVCACHE_SPACE (whole GiB only): a later flag wins
    assert "VLLM_CPU_KVCACHE_SPACE" not in lifecycle.server_env()
    monkeypatch.setattr(lifecycle, "has_cuda", lambda: True)
    assert "--kv-cache-memory-bytes" not in lifecycle.default_engine_args("m")
