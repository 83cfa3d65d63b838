"""The exploit audit on a hub server over real HTTP on 127.0.0.1: the audit route (owner only,
once per version, size-bounded, validated), `RemoteHub.push` and `rlkit env push` attaching the
audit to the version they publish, `rlkit env info` and the environment's page showing it, and
package-supplied exploit names rendered inert (also in headless Chromium)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlkit.hub import RemoteHub
from rlkit.hub.names import EnvRef
from rlkit.hub.records import MAX_AUDIT_BYTES, AuditRecord, AuditRow
from rlkit.hub.server.app import create_app
from rlkit.hub.server.db import create_token
from tests.helpers.audited_envs import BACKDOOR, audited_package
from tests.helpers.browser import headless_chromium
from tests.helpers.cli import run_cli
from tests.helpers.hub_dists import make_sdist, make_wheel
from tests.helpers.hub_http import serve_app, upload

XSS_NAME = "<script>alert('exploit')</script>"
XSS_VARIANT = '<img src=x onerror="alert(1)">'


@dataclass
class AuditHub:
    url: str
    alice: str
    bob: str


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditHub]:
    app = create_app(tmp_path_factory.mktemp("hubdata"))
    engine = app.state.store.engine
    alice, bob = create_token(engine, "alice"), create_token(engine, "bob")
    with serve_app(app) as url:
        yield AuditHub(url, alice, bob)


def record(**changes: object) -> AuditRecord:
    rows = [
        AuditRow(
            exploit="constant",
            best_variant="yes",
            mean=1.0,
            rows=4,
            full_reward_rows=4,
            verdict="FAIL: full reward on 0 (yes)",
        ),
        AuditRow(exploit=XSS_NAME, family="evil", best_variant=XSS_VARIANT, mean=0.0, rows=4),
        AuditRow(exploit="echo", mean=0.0, rows=4),
    ]
    base = AuditRecord(
        date="2026-05-01T12:00:00+00:00",
        rows=4,
        split="eval",
        min_reward=0,
        max_reward=1,
        gold_mean=1.0,
        empty_mean=0.0,
        floor=0.05,
        ok=False,
        exploits_allowed=True,
        table=rows,
    )
    return base.model_copy(update=changes)


def dists(tmp_path: Path, name: str, version: str) -> list[Path]:
    paths = []
    for filename, data in (make_wheel(name, version), make_sdist(name, version)):
        (tmp_path / filename).write_bytes(data)
        paths.append(tmp_path / filename)
    return paths


def post_audit(hub: AuditHub, path: str, token: str | None, **kwargs: object) -> httpx.Response:
    auth = ("__token__", token) if token else None
    return httpx.post(f"{hub.url}/api/v1/envs/{path}/audit", auth=auth, timeout=30, **kwargs)


def test_audit_route_is_the_owners_once_bounded_and_validated(hub: AuditHub) -> None:
    assert upload(hub, hub.alice, *make_wheel("route-env", "0.1.0")).status_code == 200
    body = record().model_dump(mode="json")
    assert post_audit(hub, "alice/route-env/0.1.0", None, json=body).status_code == 401
    assert post_audit(hub, "alice/route-env/0.1.0", "rlkit_bad", json=body).status_code == 401
    assert post_audit(hub, "alice/route-env/0.1.0", hub.bob, json=body).status_code == 403
    assert post_audit(hub, "bob/route-env/0.1.0", hub.bob, json=body).status_code == 404
    assert post_audit(hub, "alice/route-env/9.9", hub.alice, json=body).status_code == 404
    for bad in (
        {"table": [{"family": "no exploit name"}]},
        {"table": [{"exploit": "x" * 201}]},
        {"ran": False, "ok": True},
        {"gold_mean": "high"},
    ):
        refused = post_audit(hub, "alice/route-env/0.1.0", hub.alice, json=body | bad)
        assert refused.status_code == 422, (bad, refused.text)
    nan = json.dumps(body).replace('"gold_mean": 1.0', '"gold_mean": NaN')
    assert post_audit(hub, "alice/route-env/0.1.0", hub.alice, content=nan).status_code == 422
    assert post_audit(hub, "alice/route-env/0.1.0", hub.alice, content=b"\x80 not json").is_error
    huge = json.dumps(body | {"padding": "x" * MAX_AUDIT_BYTES})
    assert post_audit(hub, "alice/route-env/0.1.0", hub.alice, content=huge).status_code == 413

    def chunked() -> Iterator[bytes]:  # no Content-Length: the stream is cut at the bound
        yield b'{"table": ['
        for _ in range(MAX_AUDIT_BYTES // 1000 + 2):
            yield b" " * 1000

    assert post_audit(hub, "alice/route-env/0.1.0", hub.alice, content=chunked()).status_code == 413
    card = httpx.get(f"{hub.url}/api/v1/envs/alice/route-env", timeout=30).json()
    assert card["versions"][0]["audit"] is None  # nothing refused was stored

    stored = post_audit(hub, "alice/route-env/0.1.0", hub.alice, json=body)
    assert stored.status_code == 201, stored.text
    assert AuditRecord.model_validate(stored.json()) == record()
    again = post_audit(hub, "alice/route-env/0.1.0", hub.alice, json=record(ok=True).model_dump())
    assert again.status_code == 409  # what a version was published with stays
    card = RemoteHub(hub.url).card(EnvRef("alice", "route-env"))
    assert card.latest_audit == record()


def test_remote_push_attaches_the_audit_to_its_version(hub: AuditHub, tmp_path: Path) -> None:
    client = RemoteHub(hub.url, hub.alice)
    first = client.push(dists(tmp_path, "push-env", "0.1.0"), audit=record())
    assert first.get_version("0.1.0").audit == record()
    second = client.push(dists(tmp_path, "push-env", "0.2.0"), audit=AuditRecord.not_run())
    assert second.latest_audit.verdict == "not run"
    third = client.push(dists(tmp_path, "push-env", "0.3.0"))  # a library push, no audit
    assert third.latest_audit is None and third.get_version("0.1.0").audit == record()
    page = httpx.get(f"{hub.url}/envs/alice/push-env", timeout=30).text
    assert "not audited" in page and "audit-table" not in page  # the latest version's


def test_audit_table_on_the_page_is_escaped(hub: AuditHub, tmp_path: Path) -> None:
    RemoteHub(hub.url, hub.alice).push(dists(tmp_path, "page-env", "0.1.0"), audit=record())
    page = httpx.get(f"{hub.url}/envs/alice/page-env", timeout=30).text
    assert 'id="audit-table"' in page and "failed" in page
    assert "published with --allow-exploits" in page
    assert XSS_NAME not in page and XSS_VARIANT not in page
    assert "&lt;script&gt;alert(&#39;exploit&#39;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page
    assert "FAIL: full reward on 0 (yes)" in page and "4/4" in page


def test_cli_push_to_a_hub_server_audits_refuses_and_records(
    hub: AuditHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    package = audited_package(tmp_path, "server-backdoor-env", BACKDOOR)
    push = ["env", "push", str(package), "--hub", hub.url, "--token", hub.alice]
    code, out = run_cli(monkeypatch, capsys, *push, "--audit-rows", "3")
    assert code == 1 and "not published: exploit(s) constant" in out, out
    gone = httpx.get(f"{hub.url}/api/v1/envs/alice/server-backdoor-env", timeout=30)
    assert gone.status_code == 404  # nothing was uploaded
    assert "server-backdoor-env" not in httpx.get(f"{hub.url}/simple/", timeout=30).text

    code, out = run_cli(monkeypatch, capsys, *push, "--audit-rows", "3", "--allow-exploits")
    assert code == 0 and "published alice/server-backdoor-env@0.1.0" in out, out
    card = RemoteHub(hub.url).card(EnvRef("alice", "server-backdoor-env"))
    audit = card.latest_audit
    assert audit is not None and (audit.ok, audit.exploits_allowed, audit.rows) == (False, True, 3)
    constant = next(row for row in audit.table if row.exploit == "constant")
    assert (constant.full_reward_rows, constant.mean) == (3, 1.0)

    code, out = run_cli(
        monkeypatch, capsys, "env", "info", "alice/server-backdoor-env", "--hub", hub.url
    )
    assert "audit of 0.1.0: failed (published with --allow-exploits)" in out
    assert "full-reward rows" in out and "FAIL: full reward" in out
    page = httpx.get(f"{hub.url}/envs/alice/server-backdoor-env", timeout=30).text
    assert 'id="audit-table"' in page and "judge bait" in page


@pytest.mark.system
def test_audit_table_in_headless_chromium(hub: AuditHub, tmp_path: Path) -> None:
    RemoteHub(hub.url, hub.alice).push(dists(tmp_path, "web-audit", "0.1.0"), audit=record())
    with headless_chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{hub.url}/envs/alice/web-audit")
        header = page.locator("#audit-table thead th").all_inner_texts()
        assert header == [
            "Exploit",
            "Family",
            "Best variant",
            "Mean",
            "Full-reward rows",
            "Verdict",
        ]
        rows = page.locator("#audit-table tbody tr").all_inner_texts()
        assert len(rows) == 3
        assert rows[0].split("\t") == [
            "constant",
            "generic",
            "yes",
            "1.000",
            "4/4",
            "FAIL: full reward on 0 (yes)",
        ]
        assert rows[1].split("\t")[:3] == [XSS_NAME, "evil", XSS_VARIANT]  # shown as text
        assert page.locator("#audit-table tbody tr.fail").count() == 1
        assert page.inner_text("#audit-gold") == "1.000"
        assert page.inner_text("#audit-empty") == "0.000"
        assert page.inner_text("#audit-floor") == "0.050"
        assert page.locator("#audit img").count() == 0 and dialogs == []
        page.goto(f"{hub.url}/envs/alice/web-audit")  # reload: still no script ran
        assert dialogs == []
