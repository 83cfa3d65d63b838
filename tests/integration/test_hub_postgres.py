"""The hub server's store on PostgreSQL: the same code as on SQLite, behind a database URL.

Starts a throwaway cluster with the Debian `postgresql` binaries (skipped when they or psycopg
are missing, a failure under CI=true) and runs uploads, ownership, immutability, privacy,
concurrency and evaluations.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.hub import EvalRecord, HubError
from rlkit.hub.artifacts import inspect_artifact
from rlkit.hub.server.db import create_token, make_engine
from rlkit.hub.server.store import HubStore
from tests.helpers.hub_dists import make_sdist, make_wheel
from tests.helpers.system import require_system

pytestmark = [pytest.mark.system, pytest.mark.slow]  # PostgreSQL and hub servers

BINDIRS = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


@pytest.fixture(autouse=True, scope="module")
def _postgres_installed() -> None:
    require_system("PostgreSQL", bool(BINDIRS), "apt-get install postgresql")
    require_system(
        "psycopg", importlib.util.find_spec("psycopg") is not None, "pip install 'rlkit[hub]'"
    )


def as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the `postgres` user when we are root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    bindir = Path(BINDIRS[-1])
    root = Path(tempfile.mkdtemp(prefix="rlkit-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(
        as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data)]
    subprocess.run(
        as_postgres([*pg_ctl, "-o", options, "-l", str(root / "log"), "-w", "start"]),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_postgres([*pg_ctl, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_store_on_postgres(pg_url: str, tmp_path: Path) -> None:
    engine = make_engine(pg_url)
    store = HubStore(engine, tmp_path / "files")
    alice = create_token(engine, "alice")
    assert store.owner_of(alice) == "alice" and store.owner_of(None) is None
    with pytest.raises(HubError, match="invalid API token"):
        store.owner_of("nope")

    def push(owner: str, dist: tuple[str, bytes]) -> None:
        store.upload(owner, inspect_artifact(dist[1], dist[0]), dist[1])

    push("alice", make_wheel("pg-env", "0.1.0"))
    push("alice", make_sdist("pg-env", "0.1.0"))
    with pytest.raises(HubError) as err:
        push("alice", make_wheel("pg-env", "0.1.0"))
    assert err.value.status == 409
    with pytest.raises(HubError) as err:
        push("bob", make_wheel("pg-env", "0.2.0"))
    assert err.value.status == 403

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda i: push("alice", make_wheel("pg-env", f"1.{i}")), range(20)))
    card = store.card("alice", "pg-env", viewer=None)
    assert len(card.versions) == 21 and card.latest_version == "1.19"
    assert card.tags == ["demo", "math"]

    store.set_visibility("alice", "pg-env", "alice", "private")
    with pytest.raises(HubError):
        store.card("alice", "pg-env", viewer="bob")
    assert store.search(viewer=None) == [] and store.search(viewer="alice")[0].name == "pg-env"
    store.add_eval("alice", "pg-env", "0.1.0", EvalRecord(model="m", mean_reward=1, n=2), "alice")
    assert store.card("alice", "pg-env", viewer="alice").evals[0].version == "0.1.0"
    engine.dispose()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_server_processes_race_without_losing_a_committed_file(
    pg_url: str, tmp_path: Path
) -> None:
    """Two `rlkit hub serve` processes on one database and one data dir; 50 concurrent uploads,
    each file name sent twice with different bytes: every committed file is present and its
    bytes match the hash the database recorded."""
    import httpx

    from tests.helpers.hub_http import upload

    engine = make_engine(pg_url)
    token = create_token(engine, "racer")
    engine.dispose()
    ports = [_free_port(), _free_port()]
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlkit_cli.main",
                "hub",
                "serve",
                "--data",
                str(tmp_path),
                "--db",
                pg_url,
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for port in ports
    ]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        deadline = time.monotonic() + 60
        for url in urls:
            while True:
                try:
                    httpx.get(f"{url}/simple/", timeout=2)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, "hub server did not start"
                    time.sleep(0.3)
        jobs = []
        for i in range(25):
            for side in (0, 1):
                filename, data = make_wheel("race-env", f"0.0.{i}", readme=f"# side {side}")
                jobs.append((SimpleNamespace(url=urls[side]), filename, data))
        with ThreadPoolExecutor(50) as pool:
            responses = list(pool.map(lambda j: upload(j[0], token, j[1], j[2]), jobs))
        codes = sorted(r.status_code for r in responses)
        assert set(codes) <= {200, 409}, codes
        assert codes.count(200) == 25  # exactly one winner per file name
        card = httpx.get(f"{urls[0]}/api/v1/envs/racer/race-env", timeout=60).json()
        recorded = {f["filename"]: f["sha256"] for v in card["versions"] for f in v["files"]}
        assert len(recorded) == 25
        for filename, sha in recorded.items():
            for url in urls:
                served = httpx.get(f"{url}/files/race-env/{filename}", timeout=60)
                assert served.status_code == 200, filename
                assert hashlib.sha256(served.content).hexdigest() == sha, filename
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)


def test_leaderboard_verification_on_postgres(pg_url: str, tmp_path: Path) -> None:
    """The claimed -> verified flow through the HTTP server, on PostgreSQL."""
    from tests.helpers.hub_running import check_leaderboard, running_hub

    with running_hub(tmp_path, pg_url) as hub:
        check_leaderboard(hub)
