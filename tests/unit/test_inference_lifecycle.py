"""The environment rlkit gives the vLLM servers it starts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

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


def test_stale_server_socket_folders_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    exited = subprocess.Popen(["true"])
    exited.wait()

    def folder(name: str, owner: int | None, age_s: float = 0.0) -> Path:
        path = tmp_path / f"{lifecycle.RPC_DIR_PREFIX}{name}"
        path.mkdir()
        if owner is not None:
            (path / lifecycle.RPC_DIR_OWNER).write_text(str(owner))
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    dead = folder("dead", exited.pid)
    live = folder("live", os.getpid())
    starting = folder("starting", None)  # its server is being started: no owner file yet
    orphan = folder("orphan", None, age_s=3600)
    other = tmp_path / "not-ours"
    other.mkdir()
    assert sorted(lifecycle.remove_stale_rpc_dirs()) == sorted([dead, orphan])
    assert live.exists() and starting.exists() and other.exists()
