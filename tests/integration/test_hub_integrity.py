"""Leaderboard integrity and token lifecycle on a real hub server (HTTP, SQLite database).

Results are claims until the environment's owner or a trusted runner re-runs them; tokens can
expire and be revoked, and a dead token gets a 401 that says why. Tokens are created, listed
and revoked through the `rlkit hub token` CLI against the server's own database.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.hub_dists import make_wheel
from tests.helpers.hub_http import upload
from tests.helpers.hub_running import Hub, check_leaderboard, running_hub

# a hub server, a fake model server and `rlkit eval` runs: about 7 s
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hubdata")) as running:
        yield running


def test_results_are_claims_until_the_owner_or_a_trusted_runner_reproduces_them(hub: Hub):
    check_leaderboard(hub)


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
        assert refused.status_code == 401 and why in refused.json()["error"]
        assert refused.headers["www-authenticate"].startswith("Basic")
        # a dead token is never silently treated as anonymous, on reads or writes
        index = httpx.get(f"{hub.url}/simple/", auth=("__token__", token), timeout=30)
        assert index.status_code == 401 and why in index.json()["error"]
        filename, wheel = make_wheel("dead-token-env", "0.1.0")
        assert upload(hub, token, filename, wheel).status_code == 401
        code, out = run_cli(monkeypatch, capsys, "env", "list", "--hub", hub.url, "--token", token)
        assert code == 2 and why in out  # what a user of the CLI sees
    unknown = _whoami(hub, "rlkit_not-a-token")
    assert unknown.status_code == 401 and unknown.json()["error"] == "invalid API token"

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
