"""Cached venvs for bridge workers: one per (environment, exact verifiers version, requirements).

`$RLKIT_BRIDGE_VENVS` (default `$RLKIT_HOME/bridge/venvs`, `~/.rlkit/bridge/venvs`) holds
`<env>-vf<version>-<hash>/`; the hash covers the requirement list, so an environment that changes
its dependencies gets a new venv and one that only changes its code reuses the old one (local
environments are imported from their folder). Built with `uv` (a dependency of rlkit: seconds
where venv + pip took ~1.5 minutes a venv); a file lock makes concurrent runs build it once, and
a marker written last means a venv whose build was interrupted is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rlkit.errors import UsageError

COMPLETE = ".rlkit-bridge-complete"


def venvs_root() -> Path:
    if os.environ.get("RLKIT_BRIDGE_VENVS"):
        return Path(os.environ["RLKIT_BRIDGE_VENVS"]).expanduser()
    return Path(os.environ.get("RLKIT_HOME") or "~/.rlkit").expanduser() / "bridge" / "venvs"


def venv_dir(env_name: str, verifiers_version: str, requirements: list[str]) -> Path:
    key = json.dumps([verifiers_version, sorted(requirements)]).encode()
    digest = hashlib.sha256(key).hexdigest()[:10]
    return venvs_root() / f"vf{verifiers_version}-{digest}"


def find_uv() -> str:
    """The `uv` binary of the `uv` package rlkit depends on (found from the package, so also
    when its bin folder is not on PATH), else one on PATH."""
    from uv import find_uv_bin

    try:
        return find_uv_bin()
    except FileNotFoundError as missing:
        found = shutil.which("uv")
        if found:
            return found
        raise UsageError(
            "the uv binary is missing (rlkit builds verifiers venvs with it; reinstall rlkit "
            f"or put uv on PATH): {missing}"
        ) from None


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"{what} failed ({' '.join(cmd[:6])} ...):\n{done.stderr[-3000:]}")


def ensure_venv(
    env_name: str, verifiers_version: str, requirements: list[str], log: object = None
) -> Path:
    """The python of a venv with `verifiers==VERSION` + `requirements`, built once and cached."""
    path = venv_dir(env_name, verifiers_version, requirements)
    python = path / "bin" / "python"
    if (path / COMPLETE).exists():
        return python
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / COMPLETE).exists():
            return python
        shutil.rmtree(path, ignore_errors=True)
        if callable(log):
            log(
                f"building a venv for {env_name} with verifiers=={verifiers_version} in {path} "
                "(installing its packages; once per version)..."
            )
        t0 = time.monotonic()
        wanted = [f"verifiers=={verifiers_version}", *requirements]
        uv = find_uv()
        _run([uv, "venv", "-q", "--python", sys.executable, str(path)], "creating the venv")
        install = [uv, "pip", "install", "-q", "--python", str(python), *wanted]
        _run(install, f"installing verifiers=={verifiers_version} for {env_name}")
        seconds = time.monotonic() - t0
        (path / COMPLETE).write_text(json.dumps({"seconds": seconds}))
        if callable(log):
            log(f"venv for {env_name} built in {seconds:.0f}s")
    return python
