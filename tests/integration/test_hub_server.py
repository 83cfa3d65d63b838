"""The hub server over real HTTP on 127.0.0.1: auth, immutability, validation, privacy,
PEP 691 negotiation, concurrent uploads, evaluations, and the web pages in headless Chromium."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlkit.hub import EvalRecord, HubError, RemoteHub
from rlkit.hub.names import EnvRef
from rlkit.hub.server.app import create_app
from rlkit.hub.server.db import create_token
from tests.helpers.browser import CHROMIUM_ARGS
from tests.helpers.hub_dists import make_sdist, make_wheel
from tests.helpers.hub_http import serve_app, upload
from tests.helpers.system import require_system

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


@dataclass
class RunningHub:
    url: str
    data_dir: Path
    alice: str
    bob: str


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    """A hub server (1 MB upload limit) in a background thread, with tokens for two owners."""
    data_dir = tmp_path_factory.mktemp("hubdata")
    app = create_app(data_dir, max_upload_mb=1.0)
    engine = app.state.store.engine
    alice, bob = create_token(engine, "alice"), create_token(engine, "bob")
    with serve_app(app) as url:
        yield RunningHub(url, data_dir, alice, bob)


def test_uploads_need_a_valid_token_and_the_right_namespace(hub: RunningHub) -> None:
    filename, data = make_wheel("auth-env", "0.1.0")
    assert upload(hub, None, filename, data).status_code == 401
    assert upload(hub, "rlkit_wrong", filename, data).status_code == 401
    assert upload(hub, hub.alice, filename, data).status_code == 200
    other = make_wheel("auth-env", "0.2.0")
    assert upload(hub, hub.bob, *other).status_code == 403
    put = httpx.put(
        f"{hub.url}/api/v1/envs/alice/auth-env",
        json={"visibility": "private"},
        auth=("__token__", hub.bob),
    )
    assert put.status_code == 403
    bob_hub = RemoteHub(hub.url, hub.bob)
    with pytest.raises(HubError) as err:
        bob_hub.push([], owner="alice")
    assert err.value.status == 400  # nothing to push is refused before any request
    card = RemoteHub(hub.url).card(EnvRef("alice", "auth-env"))
    assert [v.version for v in card.versions] == ["0.1.0"]


def test_published_versions_are_immutable(hub: RunningHub, tmp_path: Path) -> None:
    wheel = make_wheel("immut-env", "1.0")
    assert upload(hub, hub.alice, *wheel).status_code == 200
    again = upload(hub, hub.alice, *wheel)
    assert again.status_code == 409 and "immutable" in again.json()["error"]
    changed = make_wheel("immut-env", "1.0", readme="# changed")
    assert upload(hub, hub.alice, *changed).status_code == 409
    # twine (through `rlkit env push`'s client) for a new version, then a refused re-push
    paths = []
    for filename, data in (make_wheel("immut-env", "1.1"), make_sdist("immut-env", "1.1")):
        (tmp_path / filename).write_bytes(data)
        paths.append(tmp_path / filename)
    client = RemoteHub(hub.url, hub.alice)
    assert upload(hub, hub.alice, paths[0].name, paths[0].read_bytes()).status_code == 200
    card = client.push(paths)  # completes the interrupted push: only the sdist is sent
    assert card.latest_version == "1.1" and len(card.get_version("1.1").files) == 2
    with pytest.raises(HubError) as err:
        client.push(paths)
    assert err.value.status == 409


@pytest.mark.parametrize(
    ("filename", "payload", "status"),
    [
        ("../../evil-1.0-py3-none-any.whl", None, 400),
        ("sub/evil-1.0-py3-none-any.whl", None, 400),
        ("evil-1.0.zip", None, 400),
        ("evil-1.0-py3-none-any.whl", b"PK\x03\x04 not really a zip", 400),
        ("evil-1.0.tar.gz", b"plain text", 400),
        ("evil-1.0-py3-none-any.whl", b"x" * (2 * 1024 * 1024), 413),
    ],
)
def test_malicious_uploads_are_refused(
    hub: RunningHub, filename: str, payload: bytes | None, status: int
) -> None:
    data = payload if payload is not None else make_wheel("evil", "1.0")[1]
    response = upload(hub, hub.alice, filename, data)
    assert response.status_code == status, response.text
    assert not (hub.data_dir / "files" / "evil").exists()
    assert not any(p.name.startswith("evil") for p in hub.data_dir.rglob("*"))


def test_traversal_inside_archive_and_digest_mismatch(hub: RunningHub) -> None:
    filename, data = make_wheel("evil", "2.0", extra={"../../../tmp/pwned": b"x"})
    assert upload(hub, hub.alice, filename, data).status_code == 400
    filename, data = make_wheel("evil", "2.1")
    assert upload(hub, hub.alice, filename, data, sha256_digest="0" * 64).status_code == 400
    filename, data = make_wheel("evil", "2.2")
    assert upload(hub, hub.alice, filename, data, name="other-name").status_code == 400


def test_private_environments_are_invisible_to_others(hub: RunningHub, tmp_path: Path) -> None:
    claim = httpx.put(
        f"{hub.url}/api/v1/envs/alice/secret-env",
        json={"visibility": "private"},
        auth=("__token__", hub.alice),
    )
    assert claim.status_code == 200
    filename, data = make_wheel("secret-env", "0.1.0")
    assert upload(hub, hub.alice, filename, data).status_code == 200
    paths = [
        "/simple/secret-env/",
        "/api/v1/envs/alice/secret-env",
        "/envs/alice/secret-env",
        f"/files/secret-env/{filename}",
    ]
    for auth in (None, ("__token__", hub.bob)):
        for path in paths:
            assert httpx.get(hub.url + path, auth=auth).status_code == 404, path
        assert "secret-env" not in httpx.get(f"{hub.url}/simple/", auth=auth).text
        assert "secret-env" not in httpx.get(f"{hub.url}/api/v1/envs", auth=auth).text
        assert "secret-env" not in httpx.get(f"{hub.url}/", auth=auth).text
    owner = ("__token__", hub.alice)
    for path in paths:
        assert httpx.get(hub.url + path, auth=owner).status_code == 200, path
    bearer = {"Authorization": f"Bearer {hub.alice}"}
    assert httpx.get(f"{hub.url}/api/v1/envs/alice/secret-env", headers=bearer).is_success
    # bob cannot take the name either
    assert upload(hub, hub.bob, *make_wheel("secret-env", "0.2.0")).status_code == 403
    # `rlkit env push --private` goes through the same claim, then twine
    filename, data = make_wheel("secret-two", "1.0")
    (tmp_path / filename).write_bytes(data)
    card = RemoteHub(hub.url, hub.alice).push([tmp_path / filename], visibility="private")
    assert card.visibility == "private"
    with pytest.raises(HubError) as err:
        RemoteHub(hub.url, hub.bob).card(EnvRef("alice", "secret-two"))
    assert err.value.status == 404


def test_simple_index_content_negotiation(hub: RunningHub) -> None:
    filename, data = make_wheel("pep691-env", "0.1.0")
    assert upload(hub, hub.alice, filename, data).status_code == 200
    as_json = httpx.get(f"{hub.url}/simple/pep691-env/", headers={"Accept": JSON_TYPE})
    assert as_json.headers["content-type"].startswith(JSON_TYPE)
    doc = as_json.json()
    assert doc["files"][0]["hashes"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert doc["versions"] == ["0.1.0"]
    preferred = httpx.get(
        f"{hub.url}/simple/",
        headers={"Accept": f"text/html;q=0.2, {JSON_TYPE};q=0.9"},
    )
    assert {"name": "pep691-env"} in preferred.json()["projects"]
    as_html = httpx.get(f"{hub.url}/simple/pep691-env/")
    assert as_html.headers["content-type"].startswith("text/html")
    assert f"#sha256={hashlib.sha256(data).hexdigest()}" in as_html.text
    latest = {"Accept": "application/vnd.pypi.simple.latest+json"}
    assert httpx.get(f"{hub.url}/simple/", headers=latest).headers["content-type"] == JSON_TYPE
    assert httpx.get(f"{hub.url}/simple/", headers={"Accept": "image/png"}).status_code == 406
    redirect = httpx.get(f"{hub.url}/simple/PEP691_Env/")
    assert redirect.status_code == 301 and redirect.headers["location"].endswith("pep691-env/")


def test_twenty_concurrent_pushes_land_intact(hub: RunningHub) -> None:
    wheels = [make_wheel("busy-env", f"3.{i}") for i in range(20)]
    with ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(lambda w: upload(hub, hub.alice, *w).status_code, wheels))
    assert statuses == [200] * 20
    card = RemoteHub(hub.url).card(EnvRef("alice", "busy-env"))
    assert len(card.versions) == 20 and card.latest_version == "3.19"
    recorded = {f.filename: f.sha256 for v in card.versions for f in v.files}
    for filename, data in wheels:
        assert recorded[filename] == hashlib.sha256(data).hexdigest()
        served = httpx.get(f"{hub.url}/files/busy-env/{filename}").content
        assert hashlib.sha256(served).hexdigest() == recorded[filename]


def test_download_refuses_tampered_artifacts(hub: RunningHub, tmp_path: Path) -> None:
    filename, data = make_wheel("tamper-env", "0.1.0")
    assert upload(hub, hub.alice, filename, data).status_code == 200
    stored = hub.data_dir / "files" / "tamper-env" / filename
    stored.write_bytes(data + b"!")
    client = RemoteHub(hub.url)
    ref = EnvRef("alice", "tamper-env")
    wheel = client.card(ref).versions[0].files[0]
    with pytest.raises(HubError, match="sha256 mismatch"):
        client.download(ref, wheel, tmp_path)
    assert not (tmp_path / filename).exists()


def test_readme_injection_renders_inert_on_the_page(hub: RunningHub) -> None:
    readme = '# Evil\n<script>alert("x")</script>\n\n<img src=x onerror="alert(1)">\n'
    filename, data = make_wheel("xss-env", "0.1.0", readme=readme)
    assert upload(hub, hub.alice, filename, data).status_code == 200
    page = httpx.get(f"{hub.url}/envs/alice/xss-env").text
    assert '<script>alert("x")' not in page and "<img src=x" not in page
    assert "&lt;script&gt;" in page


def test_eval_results_attach_to_a_version(hub: RunningHub) -> None:
    filename, data = make_wheel("board-env", "0.1.0")
    assert upload(hub, hub.alice, filename, data).status_code == 200
    url = f"{hub.url}/api/v1/envs/alice/board-env/0.1.0/evals"
    record = EvalRecord(model="m-1", mean_reward=0.75, pass_at_k={"pass@1": 0.5}, n=8)
    assert httpx.post(url, json=record.model_dump()).status_code == 401
    posted = httpx.post(url, json=record.model_dump(), auth=("__token__", hub.bob))
    assert posted.status_code == 201 and posted.json()["submitted_by"] == "bob"
    missing = httpx.post(
        url.replace("0.1.0", "9.9"), json=record.model_dump(), auth=("__token__", hub.bob)
    )
    assert missing.status_code == 404
    bad = httpx.post(url, json={"model": "m"}, auth=("__token__", hub.bob))
    assert bad.status_code == 422
    card = RemoteHub(hub.url).card(EnvRef("alice", "board-env"))
    assert card.evals[0].model == "m-1" and card.evals[0].version == "0.1.0"


@pytest.mark.system
def test_web_pages_in_headless_chromium(hub: RunningHub, tmp_path: Path) -> None:
    require_system("chromium", shutil.which("chromium") is not None, "apt-get install chromium")
    from PIL import Image, ImageStat
    from playwright.sync_api import sync_playwright

    for name, readme in (("web-math", "# Web math\n\nSolve **sums**."), ("web-code", "# Code")):
        assert upload(hub, hub.alice, *make_wheel(name, "0.1.0", readme=readme)).status_code == 200
    evals = f"{hub.url}/api/v1/envs/alice/web-math/0.1.0/evals"
    for model, reward in (("tiny-qwen3", 0.25), ("big-model", 0.875)):
        record = EvalRecord(model=model, mean_reward=reward, pass_at_k={"pass@4": 0.9}, n=12)
        assert httpx.post(evals, json=record.model_dump(), auth=("__token__", hub.bob)).is_success

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(f"{hub.url}/")
        names = page.locator(".env-name").all_inner_texts()
        assert "alice/web-math" in names and "alice/web-code" in names
        page.fill("input[name=q]", "web-ma")
        page.click("button[type=submit]")
        page.wait_for_url("**/?q=web-ma*")
        assert page.locator(".env-name").all_inner_texts() == ["alice/web-math"]
        page.goto(f"{hub.url}/?tag=demo&q=web")
        assert sorted(page.locator(".env-name").all_inner_texts()) == [
            "alice/web-code",
            "alice/web-math",
        ]
        page.goto(f"{hub.url}/?tag=no-such-tag")
        assert "No environments match" in page.inner_text("main")
        page.goto(f"{hub.url}/")
        page.click("text=alice/web-math")
        page.wait_for_url("**/envs/alice/web-math")
        rows = page.locator("#leaderboard tbody tr").all_inner_texts()
        assert rows[0].startswith("big-model") and "0.875" in rows[0] and "0.900" in rows[0]
        assert rows[1].startswith("tiny-qwen3")
        assert "rlkit env install alice/web-math@0.1.0" in page.inner_text("#install-cmd")
        assert page.locator(".readme strong").inner_text() == "sums"
        shot = tmp_path / "env-page.png"
        page.screenshot(path=str(shot), full_page=False)
        browser.close()
    image = Image.open(shot).convert("L")
    assert image.size == (1200, 900)
    assert ImageStat.Stat(image).stddev[0] > 10  # not a blank page


def test_plain_twine_cli_uploads(hub: RunningHub, tmp_path: Path) -> None:
    paths = []
    for filename, data in (make_wheel("twine-env", "0.1.0"), make_sdist("twine-env", "0.1.0")):
        (tmp_path / filename).write_bytes(data)
        paths.append(str(tmp_path / filename))
    cmd = [
        sys.executable,
        "-m",
        "twine",
        "upload",
        "--non-interactive",
        "--disable-progress-bar",
        "--repository-url",
        f"{hub.url}/legacy/",
        "-u",
        "__token__",
        "-p",
        hub.alice,
        *paths,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    card = RemoteHub(hub.url).card(EnvRef("alice", "twine-env"))
    assert len(card.versions[0].files) == 2
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "409" in again.stdout + again.stderr


def test_every_refusal_has_the_one_error_body(hub: RunningHub) -> None:
    """The hub answers its own refusals, FastAPI's (unknown route, body validation) and the
    routes' HTTP errors in rlkit's one error body, `{"error": message}`."""
    auth = ("__token__", hub.alice)
    unknown = httpx.get(f"{hub.url}/api/v1/no-such-route")
    bad_body = httpx.put(
        f"{hub.url}/api/v1/envs/alice/auth-env", json={"visibility": "secret"}, auth=auth
    )
    missing = httpx.get(f"{hub.url}/api/v1/envs/alice/never-pushed")
    for response, status in [(unknown, 404), (bad_body, 422), (missing, 404)]:
        assert response.status_code == status, response.text
        assert list(response.json()) == ["error"] and response.json()["error"], response.text
    assert "visibility" in bad_body.json()["error"]
