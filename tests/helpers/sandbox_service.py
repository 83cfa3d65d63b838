"""`rlkit sandbox serve` as a user starts it: a subprocess on a free loopback port, waited for
on /health, stopped by its own pid."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlkit.ports import free_port
from rlkit.sandbox import backends
from tests.helpers.system import require_system

START_TIMEOUT_S = 90.0


@dataclass
class Service:
    url: str
    token_file: Path
    proc: subprocess.Popen

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def tenant_file(self, name: str) -> Path:
        return self.token_file.parent / "tenants" / f"{name}.token"

    def metrics(self) -> dict:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.get(f"{self.url}/metrics", headers=headers, timeout=30).json()

    def descendants(self) -> list[int]:
        """Every process under the service (its sandboxes and what they started)."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found


@contextmanager
def sandbox_service(folder: Path, *args: str, port: int | None = None) -> Iterator[Service]:
    """A running service with `args` (e.g. `--concurrency 2`) on `port` (else a free one); its
    token file in `folder` (kept, so a service started again there takes the same token)."""
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    port = port or free_port()
    token_file = folder / "sandbox.token"
    command = [sys.executable, "-m", "rlkit_cli.main", "sandbox", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--token-file", str(token_file), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "RLKIT_SANDBOX_URL": ""},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox service exited: {proc.stderr.read().decode()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sandbox service did not come up")
            time.sleep(0.3)
        yield Service(url, token_file, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def marker() -> str:
    """A `sleep` argument no other process on the host uses."""
    return f"{random.randint(10**6, 10**7)}.{random.randint(10**5, 10**6)}"


def pids_with(text: str) -> list[int]:
    """The host's processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def shm_left(before: set[str], grace_s: float = 2.0) -> list[str]:
    """/dev/shm entries made since `before` that the sandboxes could have left: any owned by a
    sandbox uid, and any other that is not a Python multiprocessing semaphore (`sem.mp-*`, which
    every torch or vLLM process on a shared host makes and a killed one leaves behind; no
    sandbox or service process uses multiprocessing). Entries gone within `grace_s` are not."""
    from rlkit.sandbox.launch import UID_BASE

    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for name in set(os.listdir("/dev/shm")) - before:
            try:
                owner = os.lstat(f"/dev/shm/{name}").st_uid
            except OSError:
                continue
            if owner >= UID_BASE or not name.startswith("sem.mp-"):
                left.append(name)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
