"""A hub database created by an older rlkit gains the newer nullable columns on start, and its
existing tokens keep working (never expiring, not trusted runners)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import inspect
from sqlalchemy.orm import Session

from rlkit.hub.server.db import Identity, hash_token, identify, make_engine


def test_old_tables_gain_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    with sqlite3.connect(path) as conn:  # the session-2 schema of the two changed tables
        conn.execute(
            "CREATE TABLE tokens (id INTEGER PRIMARY KEY, owner VARCHAR(64), "
            "token_hash VARCHAR(64) UNIQUE, created DATETIME)"
        )
        conn.execute(
            "INSERT INTO tokens (owner, token_hash, created) VALUES (?, ?, ?)",
            ("alice", hash_token("old-token"), "2026-01-01 00:00:00"),
        )
        conn.execute(
            "CREATE TABLE evals (id INTEGER PRIMARY KEY, release_id INTEGER, model VARCHAR(300),"
            " mean_reward FLOAT, pass_at_k JSON, n INTEGER, num_examples INTEGER,"
            " rollouts_per_example INTEGER, date VARCHAR(40), submitted_by VARCHAR(64),"
            " metadata JSON)"
        )
    engine = make_engine(f"sqlite:///{path}")
    columns = {c["name"] for c in inspect(engine).get_columns("tokens")}
    assert {"expires", "revoked", "trusted_runner"} <= columns
    assert "rollouts" in {c["name"] for c in inspect(engine).get_columns("evals")}
    with Session(engine) as session:
        assert identify(session, "old-token") == Identity("alice", trusted_runner=False)
