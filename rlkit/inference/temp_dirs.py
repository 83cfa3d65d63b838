"""Where an inference server's temporary files go, and their cleanup: one folder of the server's
own (`server_temp_dir`), removed when it stops, when it exits, or by the next server's start once
its server is gone."""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from rlkit.lifetime import process_alive

RPC_DIR_PREFIX = "rlkit-vllm-rpc-"
RPC_DIR_OWNER = "server.pid"


def remove_stale_rpc_dirs(grace_s: float = 600.0) -> list[Path]:
    """Remove this user's server socket folders whose server is gone: a server whose launcher
    was SIGKILLed dies with it (parent-death signal) and no `stop` removes its folder. A folder
    whose owner file is missing is kept for `grace_s` (its server may be starting)."""
    removed = []
    for rpc_dir in Path(tempfile.gettempdir()).glob(f"{RPC_DIR_PREFIX}*"):
        try:
            if rpc_dir.stat().st_uid != os.getuid():
                continue
            owner = rpc_dir / RPC_DIR_OWNER
            if owner.exists():
                if process_alive(int(owner.read_text())):
                    continue
            elif time.time() - rpc_dir.stat().st_mtime < grace_s:
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(rpc_dir, ignore_errors=True)
        removed.append(rpc_dir)
    return removed


def server_temp_dir(env: dict[str, str]) -> Path:
    """A new folder of the server's own for all it puts in the temporary folder, named in `env`
    as its `TMPDIR` and (unless `env` names another) `VLLM_RPC_BASE_PATH`.

    vLLM leaves files in the system temporary folder at every engine start and removes none:
    the UNIX sockets of its processes (`<uuid>`, in VLLM_RPC_BASE_PATH, the temporary folder by
    default) and the torch.distributed FileStore file of its process group (`vllm_dist_<hex>`,
    always in the temporary folder). This folder goes instead: `ServerProcess.stop` removes it,
    the server removes it on exit (`remove_own_temp_dir`) and, once its server is gone, the
    next server's start (`remove_stale_rpc_dirs`; the caller writes the server's pid in
    RPC_DIR_OWNER). Torch Inductor's cache folder (`torchinductor_<user>` in the temporary
    folder: compiled kernels, 150 MB precompiled headers) is a link to the shared one there, so
    that servers keep reusing what earlier ones compiled (removing the folder unlinks it)."""
    remove_stale_rpc_dirs()
    folder = Path(tempfile.mkdtemp(prefix=RPC_DIR_PREFIX))
    inductor = shared_inductor_cache()
    inductor.mkdir(parents=True, exist_ok=True)
    (folder / inductor.name).symlink_to(inductor, target_is_directory=True)
    env["TMPDIR"] = str(folder)
    env.setdefault("VLLM_RPC_BASE_PATH", str(folder))
    return folder


def shared_inductor_cache() -> Path:
    """Torch Inductor's default cache folder, as `torch._inductor.runtime.cache_dir_utils.
    default_cache_dir` names it (not imported: the launcher need not import torch for this)."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def remove_own_temp_dir() -> None:
    """In a server exiting: remove its `server_temp_dir` folder (`rlkit infer` has no launcher
    left to do it: it execs the server)."""
    folder = Path(os.environ.get("TMPDIR", "/nonexistent"))
    try:
        ours = (folder / RPC_DIR_OWNER).read_text() == str(os.getpid())
    except OSError:
        return
    if folder.name.startswith(RPC_DIR_PREFIX) and ours:
        shutil.rmtree(folder, ignore_errors=True)
