"""A malicious hub server: cards with `../` file names and a hash that the index contradicts.
`rlkit env install` and `rlkit env pull` refuse them and write nothing outside the target."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit.hub.simple import IndexFile, project_page_html
from tests.cli import run_cli
from tests.hub_dists import make_sdist, make_wheel


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
            self.wfile.write(body or b'{"detail": "not found"}')

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
