"""Leaderboard integrity and token lifecycle on a real hub server (HTTP, SQLite database).

Results are claims until the environment's owner or a trusted runner re-runs them; tokens can
expire and be revoked, and a dead token gets a 401 that says why. Tokens are created, listed
and revoked through the `rlkit hub token` CLI against the server's own database.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlkit.hub import EvalRecord
from rlkit.hub.server.app import create_app
from rlkit.hub.server.db import create_token
from tests.cli import run_cli
from tests.fakes.fake_openai import FakeOpenAIServer
from tests.hub_dists import make_wheel
from tests.hub_http import serve_app, upload
from tests.integration.test_eval_fake import custom_env  # noqa: F401 (fixture)


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


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hubdata")) as running:
        yield running


def _post(hub: Hub, path: str, token: str | None, body: dict) -> httpx.Response:
    auth = ("__token__", token) if token else None
    return httpx.post(f"{hub.url}/api/v1/envs/alice/{path}", json=body, auth=auth, timeout=30)


def _rerun(hub: Hub, token: str | None, eval_id: int, reward: float, model: str = "m-7b"):
    body = {"model": model, "mean_reward": reward, "n": 40, "metadata": {"seed": 1}}
    return _post(hub, f"lb-env/0.1.0/evals/{eval_id}/reproductions", token, body)


def test_results_are_claims_until_the_owner_or_a_trusted_runner_reproduces_them(hub: Hub):
    check_leaderboard(hub)


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
        assert refused.status_code == 403 and "trusted runner" in refused.json()["detail"]
    assert _rerun(hub, hub.runner, eval_id + 1000, 0.9).status_code == 404
    wrong_model = _rerun(hub, hub.runner, eval_id, 0.9, model="other")
    assert wrong_model.status_code == 400 and "m-7b" in wrong_model.json()["detail"]

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


def _whoami(hub: Hub, token: str) -> httpx.Response:
    return httpx.get(f"{hub.url}/api/v1/whoami", auth=("__token__", token), timeout=30)


def test_revoked_and_expired_tokens_get_a_401_that_says_why(hub: Hub, monkeypatch, capsys):
    data = ["--data", str(hub.data)]
    code, out = run_cli(monkeypatch, capsys, "hub", "token", "create", *data, "--owner", "dave")
    assert code in (0, None), out
    dave = out.strip().splitlines()[-1]
    code, out = run_cli(
        monkeypatch, capsys, "hub", "token", "create", *data, "--owner", "erin",
        "--expires-days", "0.00002",  # 1.7 s
    )  # fmt: skip
    erin = out.strip().splitlines()[-1]
    assert _whoami(hub, dave).json() == {"owner": "dave"}
    assert _whoami(hub, erin).json() == {"owner": "erin"}

    code, out = run_cli(monkeypatch, capsys, "hub", "token", "revoke", dave, *data)
    assert code in (0, None) and "revoked a token of dave" in out
    time.sleep(2)
    for token, why in ((dave, "API token revoked on"), (erin, "API token expired on")):
        refused = _whoami(hub, token)
        assert refused.status_code == 401 and why in refused.json()["detail"]
        assert refused.headers["www-authenticate"].startswith("Basic")
        # a dead token is never silently treated as anonymous, on reads or writes
        index = httpx.get(f"{hub.url}/simple/", auth=("__token__", token), timeout=30)
        assert index.status_code == 401 and why in index.json()["detail"]
        filename, wheel = make_wheel("dead-token-env", "0.1.0")
        assert upload(hub, token, filename, wheel).status_code == 401
        code, out = run_cli(monkeypatch, capsys, "env", "list", "--hub", hub.url, "--token", token)
        assert code == 2 and why in out  # what a user of the CLI sees
    unknown = _whoami(hub, "rlkit_not-a-token")
    assert unknown.status_code == 401 and unknown.json()["detail"] == "invalid API token"

    code, out = run_cli(monkeypatch, capsys, "hub", "token", "list", *data)
    assert code in (0, None), out
    erin_row = next(line for line in out.splitlines() if " erin " in line)
    assert "never" not in erin_row and "20" in erin_row  # an expiry date is shown
    code, out = run_cli(monkeypatch, capsys, "hub", "token", "revoke", "--id", "3", *data)
    assert code in (0, None) and "revoked a token of carol" in out
    assert _whoami(hub, hub.carol).status_code == 401
    code, out = run_cli(monkeypatch, capsys, "hub", "token", "revoke", "nope", *data)
    assert code == 2 and "no such token" in out
    code, out = run_cli(monkeypatch, capsys, "hub", "token", "revoke", *data)
    assert code == 2 and "exactly one of TOKEN or --id" in out


@pytest.mark.usefixtures("custom_env")
def test_eval_push_attaches_metadata_and_rollouts_and_reproduces(hub: Hub, monkeypatch, capsys):
    """`rlkit eval --push` as bob posts a claim with the run's metadata and a rollout sample;
    bob cannot verify it; alice (the owner) verifies it with `--push --reproduces ID`."""
    filename, wheel = make_wheel("word-flip", "0.1.0")
    assert upload(hub, hub.alice, filename, wheel).status_code == 200

    def evaluate(token: str, *extra: str) -> tuple[int | str | None, str]:
        monkeypatch.setenv("RLKIT_HUB_TOKEN", token)
        with FakeOpenAIServer() as server:
            return run_cli(
                monkeypatch, capsys, "eval", "word-flip", "-m", "fake-model", "-b", server.url,
                "-n", "2", "-r", "2", "--push", "--hub", hub.url, "-o", str(hub.data / "runs"),
                *extra,
            )  # fmt: skip

    code, out = evaluate(hub.bob)
    assert code in (0, None), out
    card = httpx.get(f"{hub.url}/api/v1/envs/alice/word-flip", timeout=30).json()
    (claim,) = card["evals"]
    assert claim["submitted_by"] == "bob" and claim["status"] == "claimed"
    assert claim["mean_reward"] == 1.0 and claim["n"] == 4
    meta = claim["metadata"]
    assert meta["env_id"] == "word-flip" and meta["env_version"] == "0.1.0"
    assert meta["rlkit_version"] and meta["sampling"]["max_tokens"] == 64
    assert len(claim["rollouts"]) == 4
    assert all(r["completion"] and r["reward"] == 1.0 for r in claim["rollouts"])

    code, out = evaluate(hub.bob, "--reproduces", str(claim["id"]))
    assert code == 2 and "403" in out and "trusted runner" in out
    code, out = evaluate(hub.alice, "--reproduces", str(claim["id"]))
    assert code in (0, None), out
    card = httpx.get(f"{hub.url}/api/v1/envs/alice/word-flip", timeout=30).json()
    (claim,) = card["evals"]
    assert claim["status"] == "verified" and claim["reproductions"][0]["runner"] == "alice"

    code, out = run_cli(monkeypatch, capsys, "eval", "word-flip", "-m", "m", "--reproduces", "1")
    assert code == 2 and "--reproduces needs --push" in out
