"""The environment rlkit gives the vLLM servers it starts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rlkit import ports
from rlkit.inference import engine_args, temp_dirs


def test_cpu_servers_skip_vllms_aot_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    monkeypatch.setattr(engine_args, "has_cuda", lambda: False)
    assert engine_args.server_env()["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setattr(engine_args, "has_cuda", lambda: True)  # GPUs: vLLM's default, cache loads
    assert "VLLM_USE_AOT_COMPILE" not in engine_args.server_env()


def test_the_users_aot_compile_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    monkeypatch.setattr(engine_args, "has_cuda", lambda: False)
    assert engine_args.server_env()["VLLM_USE_AOT_COMPILE"] == "1"


def test_cpu_engines_openmp_threads_wait_passively_unless_the_user_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(engine_args, "has_cuda", lambda: False)
    assert engine_args.server_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert engine_args.server_env()["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setattr(engine_args, "has_cuda", lambda: True)
    assert "OMP_WAIT_POLICY" not in engine_args.server_env()


def test_cpu_engines_keep_a_1_gib_kv_cache_the_user_can_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(engine_args, "has_cuda", lambda: False)
    args = engine_args.default_engine_args("m")
    assert args[args.index("--kv-cache-memory-bytes") + 1] == "1G"
    # a flag instead of vLLM's VLLM_CPU_KVCACHE_SPACE (whole GiB only): a later flag wins
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_args.server_env()
    monkeypatch.setattr(engine_args, "has_cuda", lambda: True)
    assert "--kv-cache-memory-bytes" not in engine_args.default_engine_args("m")


def test_stale_server_socket_folders_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    exited = subprocess.Popen(["true"])
    exited.wait()

    def folder(name: str, owner: int | None, age_s: float = 0.0) -> Path:
        path = tmp_path / f"{temp_dirs.RPC_DIR_PREFIX}{name}"
        path.mkdir()
        if owner is not None:
            (path / temp_dirs.RPC_DIR_OWNER).write_text(str(owner))
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    dead = folder("dead", exited.pid)
    live = folder("live", os.getpid())
    starting = folder("starting", None)  # its server is being started: no owner file yet
    orphan = folder("orphan", None, age_s=3600)
    other = tmp_path / "not-ours"
    other.mkdir()
    assert sorted(temp_dirs.remove_stale_rpc_dirs()) == sorted([dead, orphan])
    assert live.exists() and starting.exists() and other.exists()


def test_a_server_gets_a_temporary_folder_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM's sockets and `vllm_dist_*` FileStore files go to the server's TMPDIR, a folder the
    stale sweep knows; Inductor's cache folder in it is the shared one."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env: dict[str, str] = {}
    folder = temp_dirs.server_temp_dir(env)
    assert folder.is_dir() and folder.parent == tmp_path
    assert folder.name.startswith(temp_dirs.RPC_DIR_PREFIX)
    assert env == {"TMPDIR": str(folder), "VLLM_RPC_BASE_PATH": str(folder)}
    shared = Path(default_cache_dir())
    assert shared.parent == tmp_path and shared.is_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))  # what the server sees
    assert Path(default_cache_dir()).resolve() == shared
    env = {"VLLM_RPC_BASE_PATH": "/sockets"}
    folder = temp_dirs.server_temp_dir(env)
    assert env == {"VLLM_RPC_BASE_PATH": "/sockets", "TMPDIR": str(folder)}  # the user's wins


def test_a_server_removes_its_own_folder_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    theirs = temp_dirs.server_temp_dir({})
    (theirs / temp_dirs.RPC_DIR_OWNER).write_text(str(os.getppid()))
    monkeypatch.setenv("TMPDIR", str(theirs))
    temp_dirs.remove_own_temp_dir()
    assert theirs.exists()
    ours = temp_dirs.server_temp_dir({})
    (ours / temp_dirs.RPC_DIR_OWNER).write_text(str(os.getpid()))
    (ours / "vllm_dist_0123").write_text("")
    shared = Path(default_cache_dir())
    (ours / shared.name / "kernel").write_text("")  # through the link
    monkeypatch.setenv("TMPDIR", str(ours))
    temp_dirs.remove_own_temp_dir()
    assert not ours.exists()
    assert (shared / "kernel").exists()  # the shared cache stays
    other = tmp_path / "not-ours"  # any other TMPDIR is never removed
    other.mkdir()
    (other / temp_dirs.RPC_DIR_OWNER).write_text(str(os.getpid()))
    monkeypatch.setenv("TMPDIR", str(other))
    temp_dirs.remove_own_temp_dir()
    assert other.exists()


def test_rlkit_infer_execs_the_server_with_its_own_temporary_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`rlkit infer` becomes the server (exec): the folder's owner is its own pid."""
    from rlkit_cli.main import app
    from typer.testing import CliRunner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    execs = []

    def fake_exec(path: str, argv: list[str], env: dict[str, str]) -> None:
        execs.append(env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execvpe", fake_exec)
    port = str(ports.free_port())
    result = CliRunner().invoke(app, ["infer", "--model", str(model), "--port", port])
    assert result.exit_code == 0, result.output
    folder = Path(execs[0]["TMPDIR"])
    assert folder.parent == tmp_path and folder.name.startswith(temp_dirs.RPC_DIR_PREFIX)
    assert execs[0]["VLLM_RPC_BASE_PATH"] == str(folder)
    assert (folder / temp_dirs.RPC_DIR_OWNER).read_text() == str(os.getpid())


def test_the_shared_inductor_cache_is_torchs_default() -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from rlkit.inference.temp_dirs import shared_inductor_cache

    assert shared_inductor_cache() == Path(default_cache_dir())
