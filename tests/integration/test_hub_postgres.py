"""The hub server's store on PostgreSQL: the same code as on SQLite, behind a database URL.

Starts a throwaway cluster with the Debian `postgresql` binaries (skipped when they or psycopg
are missing) and runs uploads, ownership, immutability, privacy, concurrency and evaluations.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlkit.hub import EvalRecord, HubError
from rlkit.hub.artifacts import inspect_artifact
from rlkit.hub.server.db import create_token, make_engine
from rlkit.hub.server.store import HubStore
from tests.hub_dists import make_sdist, make_wheel

BINDIRS = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
pytest.importorskip("psycopg")
pytestmark = pytest.mark.skipif(not BINDIRS, reason="Debian postgresql binaries not installed")


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
    assert store.owner_of(alice) == "alice" and store.owner_of("nope") is None

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
