"""Attacks on `rlkit env install` and `rlkit env pull`, through the CLI.

A malicious hub server (cards with `../` file names, a hash that the index contradicts) is
refused and nothing is written outside the target. A second index that pip is configured to
use (a same-named, higher-versioned package: dependency confusion) never supplies a package
the hub publishes, and supplies anything else only with `--public-deps`.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.hub import LocalHub
from rlkit.hub.server.app import create_app
from rlkit.hub.server.db import create_token
from rlkit.hub.simple import IndexFile, project_page_html
from tests.helpers.cli import run_cli
from tests.helpers.hub_dists import make_sdist, make_wheel
from tests.helpers.hub_http import fresh_venv, installed, run, serve_app, upload


def _card(name: str, files: list[dict]) -> bytes:
    version = {"version": "0.1.0", "files": files}
    card = {"owner": "mallory", "name": name, "latest_version": "0.1.0", "versions": [version]}
    return json.dumps(card).encode()


def _record(filename: str, data: bytes, packagetype: str, sha256: str | None = None) -> dict:
    digest = sha256 or hashlib.sha256(data).hexdigest()
    return {"filename": filename, "sha256": digest, "size": len(data), "packagetype": packagetype}


@pytest.fixture
def evil_hub(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Serves /api/v1/envs/mallory/*, /simple/* and /files/* from a fixed table of lies."""
    victim = tmp_path / "victim"
    escape = f"../../../../../../../../..{victim}"
    wheel_name, wheel = make_wheel("evil-env", "0.1.0")
    sdist_name, sdist = make_sdist("evil-env", "0.1.0")
    good_wheel = hashlib.sha256(wheel).hexdigest()
    routes: dict[str, bytes] = {}
    # 1. traversal: the card names files outside any download dir
    routes["/api/v1/envs/mallory/trav-env"] = _card(
        "trav-env",
        [
            _record(f"{escape}/pwned.whl", wheel, "bdist_wheel"),
            _record(f"{escape}/pwned.tar.gz", sdist, "sdist"),
        ],
    )
    # 2. the card's hash (matching the altered bytes served) is not the index's hash
    altered = wheel + b"trojan"
    routes["/api/v1/envs/mallory/evil-env"] = _card(
        "evil-env",
        [
            _record(wheel_name, altered, "bdist_wheel"),
            _record(sdist_name, sdist + b"x", "sdist"),
        ],
    )
    files = [
        IndexFile(wheel_name, f"../../files/evil-env/{wheel_name}", good_wheel, len(wheel)),
        IndexFile(sdist_name, f"../../files/evil-env/{sdist_name}", "0" * 64, len(sdist)),
    ]
    routes["/simple/evil-env/"] = project_page_html("evil-env", files).encode()
    routes["/simple/trav-env/"] = routes["/simple/evil-env/"]
    routes[f"/files/evil-env/{wheel_name}"] = altered
    routes[f"/files/evil-env/{sdist_name}"] = sdist + b"x"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = routes.get(self.path.split("?")[0])
            if body is None:  # any file path at all: serve the wheel (a traversal would land)
                body = wheel if self.path.startswith("/files/") else None
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b'{"error": "not found"}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", victim
    finally:
        server.shutdown()
        server.server_close()


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def _fetch(url: str, env: str, verb: str, tmp_path: Path, monkeypatch, capsys):
    """`rlkit env VERB mallory/ENV@0.1.0` from the evil hub, run in an empty target dir;
    (exit code, output, target dir)."""
    target = tmp_path / "target"
    target.mkdir()
    monkeypatch.chdir(target)
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    args = ["env", verb, f"mallory/{env}@0.1.0", "--hub", url]
    code, out = run_cli(monkeypatch, capsys, *args, *(["--dir", str(target)] * (verb == "pull")))
    return code, out, target


@pytest.mark.parametrize("verb", ["install", "pull"])
def test_traversal_names_are_refused(evil_hub, tmp_path, monkeypatch, capsys, verb) -> None:
    url, victim = evil_hub
    code, out, target = _fetch(url, "trav-env", verb, tmp_path, monkeypatch, capsys)
    assert code == 2, out
    assert "unsafe file name" in out
    assert not victim.exists() and _tree(target) == []


@pytest.mark.parametrize("verb", ["install", "pull"])
def test_hash_the_index_contradicts_is_refused(
    evil_hub, tmp_path, monkeypatch, capsys, verb
) -> None:
    url, _ = evil_hub
    code, out, target = _fetch(url, "evil-env", verb, tmp_path, monkeypatch, capsys)
    assert code == 2, out
    assert "the hub's index lists sha256" in out
    assert _tree(target) == []


# ---- dependency confusion: a same-named package on a second (public) index ----


@dataclass
class Confusion:
    hub: str  # an honest hub server
    public: str  # the attacker's second index, configured as pip's own index
    python: str  # a fresh virtualenv the CLI installs into

    def rlkit(self, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        """`rlkit ARGS --hub HUB` with the fresh python, pip configured for the second index
        (as a user's pip.conf or environment might be)."""
        pip_env = {"PIP_INDEX_URL": self.public, "PIP_EXTRA_INDEX_URL": self.public}
        return run([*args, "--hub", self.hub], python=self.python, env=pip_env, expect=expect)


@pytest.fixture(scope="module")
def confusion(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Confusion]:
    """Alice publishes conf-env (needing her conf-helper 1.0), conf-pub (needing pub-ok, which
    only the public index has) and conf-trap (needing pub-lib, whose own dependency is
    conf-helper>=50). The second index serves conf-helper 99 and conf-env 99: same names,
    higher versions, the attacker's code."""
    root = tmp_path_factory.mktemp("confusion")
    public = LocalHub(root / "public", owner="mallory")
    for name, version, requires in [
        ("conf-helper", "99.0", ()),
        ("conf-env", "99.0", ()),
        ("pub-ok", "1.0", ()),
        ("pub-lib", "1.0", ("conf-helper>=50",)),
    ]:
        filename, data = make_wheel(name, version, requires=requires)
        (root / filename).write_bytes(data)
        public.push([root / filename])
    app = create_app(root / "hub")
    alice = create_token(app.state.store.engine, "alice")
    with serve_app(app) as url:
        for name, requires in [
            ("conf-helper", ()),
            ("conf-env", ("conf-helper",)),
            ("conf-pub", ("pub-ok",)),
            ("conf-trap", ("pub-lib",)),
        ]:
            version = "1.0" if name == "conf-helper" else "0.1.0"
            for dist in (make_wheel(name, version, requires=requires), make_sdist(name, version)):
                response = upload(SimpleNamespace(url=url), alice, *dist)
                assert response.status_code == 200, response.text
        yield Confusion(url, public.index_url(), fresh_venv(root))


@pytest.mark.venv
def test_hub_packages_come_only_from_the_hub(confusion: Confusion) -> None:
    confusion.rlkit("env", "install", "alice/conf-env")
    assert installed(confusion.python, "conf-env") == "0.1.0"
    assert installed(confusion.python, "conf-helper") == "1.0"  # not the public 99.0
    assert installed(sys.executable, "conf-env") is None  # the project venv is untouched


@pytest.mark.venv
def test_public_dependencies_need_consent(confusion: Confusion) -> None:
    refused = confusion.rlkit("env", "install", "alice/conf-pub", expect=2)
    assert "pub-ok: not on the hub" in refused.stderr and "--public-deps" in refused.stderr
    assert installed(confusion.python, "conf-pub") is None
    confusion.rlkit("env", "install", "alice/conf-pub", "--public-deps")
    assert installed(confusion.python, "conf-pub") == "0.1.0"
    assert installed(confusion.python, "pub-ok") == "1.0"


@pytest.mark.venv
def test_public_resolution_that_names_a_hub_package_is_refused(confusion: Confusion) -> None:
    refused = confusion.rlkit("env", "install", "alice/conf-trap", "--public-deps", expect=2)
    assert "would supply conf-helper, which the hub publishes" in refused.stderr
    for dist in ("conf-trap", "pub-lib"):
        assert installed(confusion.python, dist) is None
    assert installed(confusion.python, "conf-helper") in (None, "1.0")


@pytest.mark.venv
def test_pull_takes_the_hubs_source(confusion: Confusion, tmp_path: Path) -> None:
    pulled = confusion.rlkit("env", "pull", "alice/conf-env", "-d", str(tmp_path))
    assert "conf_env-0.1.0" in pulled.stdout
    assert _tree(tmp_path) == [
        "conf_env-0.1.0",
        "conf_env-0.1.0/PKG-INFO",
        "conf_env-0.1.0/README.md",
    ]
