"""Helpers for tests that talk to a real hub server over HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import httpx
import uvicorn
from fastapi import FastAPI

from rlkit.ports import free_port


class HasUrl(Protocol):
    url: str


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """Run `app` with uvicorn in a background thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "hub server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def upload(
    hub: HasUrl, token: str | None, filename: str, data: bytes, **fields: str
) -> httpx.Response:
    """One legacy-API upload, exactly the form twine sends."""
    name, version = filename.split("-")[0].replace("_", "-"), filename.split("-")[1]
    version = version.removesuffix(".tar.gz")
    form = {
        ":action": "file_upload",
        "protocol_version": "1",
        "name": name,
        "version": version,
        "sha256_digest": hashlib.sha256(data).hexdigest(),
        **fields,
    }
    auth = ("__token__", token) if token is not None else None
    return httpx.post(
        f"{hub.url}/legacy/",
        data=form,
        files={"content": (filename, data, "application/octet-stream")},
        auth=auth,
        timeout=60,
    )


def fresh_venv(root: Path) -> str:
    """A new virtualenv that sees this venv's packages but installs into its own; returns its
    python. ``--system-site-packages`` alone exposes the *base* interpreter's packages, not the
    project venv's, so a ``.pth`` file adds those; reinstalling rlkit + torch + vLLM into every
    test venv would take minutes. Packages pip installs land in the fresh venv's own
    site-packages, which come first on its path. No pip of its own (this venv's pip runs
    there): Python 3.11's ensurepip would also add an old setuptools that shadows this venv's
    and leaves torch's `setuptools>=77` unsatisfied."""
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (site / "site-packages" / "rlkit_parent.pth").write_text(
        f"import site; site.addsitedir({str(purelib)!r})\n"
    )
    return str(venv / "bin" / "python")


def installed(python: str, dist: str) -> str | None:
    """The version of distribution `dist` that `python` sees, or None."""
    code = (
        f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\nexcept Exception: pass"
    )
    return (
        subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip() or None
    )


CLI = ["-c", "from rlkit_cli.main import main; main()"]


def run(
    args: list[str],
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    expect: int = 0,
) -> subprocess.CompletedProcess[str]:
    """Run `rlkit ARGS` with `python`; assert its exit code."""
    proc = subprocess.run(
        [python, *CLI, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    assert proc.returncode == expect, f"rlkit {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc
