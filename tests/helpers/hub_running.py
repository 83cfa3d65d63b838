"""A hub server over HTTP with four tokens, and the leaderboard's claim -> reproduction ->
verified check (run on SQLite and on PostgreSQL)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from rlkit.hub import EvalRecord
from rlkit.hub.server.app import create_app
from rlkit.hub.server.db import create_token
from tests.helpers.hub_dists import make_wheel
from tests.helpers.hub_http import serve_app, upload


@dataclass
class Hub:
    url: str
    data: Path
    alice: str  # owns the environments
    bob: str  # submits results
    carol: str  # neither owner nor trusted
    runner: str  # a trusted runner (owner name "ci")


@contextmanager
def running_hub(data: Path, db_url: str | None = None) -> Iterator[Hub]:
    """A hub server on `db_url` (default SQLite in `data`) with the four tokens above."""
    app = create_app(data, db_url, verify_tolerance=0.05)
    engine = app.state.store.engine
    tokens = [create_token(engine, who) for who in ("alice", "bob", "carol")]
    runner = create_token(engine, "ci", trusted_runner=True)
    with serve_app(app) as url:
        yield Hub(url, data, *tokens, runner)


def _post(hub: Hub, path: str, token: str | None, body: dict) -> httpx.Response:
    auth = ("__token__", token) if token else None
    return httpx.post(f"{hub.url}/api/v1/envs/alice/{path}", json=body, auth=auth, timeout=30)


def _rerun(hub: Hub, token: str | None, eval_id: int, reward: float, model: str = "m-7b"):
    body = {"model": model, "mean_reward": reward, "n": 40, "metadata": {"seed": 1}}
    return _post(hub, f"lb-env/0.1.0/evals/{eval_id}/reproductions", token, body)


def check_leaderboard(hub: Hub) -> None:
    """The claim -> reproduction -> verified flow; also run on PostgreSQL."""
    filename, data = make_wheel("lb-env", "0.1.0")
    assert upload(hub, hub.alice, filename, data).status_code == 200
    claim = EvalRecord(model="m-7b", mean_reward=0.9, n=40, rollouts=[{"reward": 1.0}])
    forged = claim.model_dump() | {
        "id": 999,
        "status": "verified",
        "submitted_by": "alice",
        "reproductions": [{"model": "m-7b", "mean_reward": 0.9, "n": 40, "agrees": True}],
    }
    posted = _post(hub, "lb-env/0.1.0/evals", hub.bob, forged)
    assert posted.status_code == 201, posted.text
    result = posted.json()  # the hub ignores the forged verdict, id and submitter
    assert result["status"] == "claimed" and result["reproductions"] == []
    assert result["submitted_by"] == "bob" and result["id"] != 999
    assert result["rollouts"] == [{"reward": 1.0}]
    eval_id = result["id"]

    assert _rerun(hub, None, eval_id, 0.9).status_code == 401
    for outsider in (hub.bob, hub.carol):  # the submitter cannot verify their own claim
        refused = _rerun(hub, outsider, eval_id, 0.9)
        assert refused.status_code == 403 and "trusted runner" in refused.json()["error"]
    assert _rerun(hub, hub.runner, eval_id + 1000, 0.9).status_code == 404
    wrong_model = _rerun(hub, hub.runner, eval_id, 0.9, model="other")
    assert wrong_model.status_code == 400 and "m-7b" in wrong_model.json()["error"]

    off = _rerun(hub, hub.runner, eval_id, 0.6)  # a trusted re-run far from the claim
    assert off.status_code == 201 and off.json()["status"] == "disputed"
    agreeing = _rerun(hub, hub.alice, eval_id, 0.88)  # the owner's re-run, within 0.05
    assert agreeing.status_code == 201, agreeing.text
    verified = agreeing.json()
    assert verified["status"] == "verified"
    assert [(r["runner"], r["agrees"]) for r in verified["reproductions"]] == [
        ("ci", False),
        ("alice", True),
    ]
    trusted = _rerun(hub, hub.runner, eval_id, 0.91).json()  # a trusted runner verifies too
    assert trusted["reproductions"][-1] == trusted["reproductions"][-1] | {
        "runner": "ci",
        "agrees": True,
        "tolerance": 0.05,
    }

    unverified = EvalRecord(model="m-70b", mean_reward=0.99, n=40)
    assert _post(hub, "lb-env/0.1.0/evals", hub.carol, unverified.model_dump()).status_code == 201
    card = httpx.get(f"{hub.url}/api/v1/envs/alice/lb-env", timeout=30).json()
    assert {(e["model"], e["status"], e["submitted_by"]) for e in card["evals"]} == {
        ("m-7b", "verified", "bob"),
        ("m-70b", "claimed", "carol"),
    }
    page = httpx.get(f"{hub.url}/envs/alice/lb-env", timeout=30).text
    rows = re.findall(r"<tr class=\"(\w+)\">(.*?)</tr>", page, re.S)
    assert [status for status, _ in rows] == ["verified", "claimed"]  # verified first
    assert "0.900" in rows[0][1] and "0.910 (ci)" in rows[0][1] and "bob" in rows[0][1]
    assert "0.990" in rows[1][1] and "carol" in rows[1][1]
