"""The local directory hub: push, immutability, ownership, search, sha256 checks, static index."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.hub import EvalRecord, HubError, LocalHub, open_hub, pull
from rlkit.hub.names import EnvRef
from rlkit.hub.records import ReproductionRecord
from rlkit.hub.remote import RemoteHub
from tests.helpers.hub_dists import make_sdist, make_wheel


def write_dists(directory: Path, name: str, version: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, data in (make_wheel(name, version), make_sdist(name, version)):
        (directory / filename).write_bytes(data)
        paths.append(directory / filename)
    return paths


@pytest.fixture
def hub(tmp_path: Path) -> LocalHub:
    return LocalHub(tmp_path / "hub", owner="alice")


def test_push_list_search_info(hub: LocalHub, tmp_path: Path) -> None:
    card = hub.push(write_dists(tmp_path / "d1", "demo-env", "0.1.0"))
    assert (card.owner, card.name, card.latest_version) == ("alice", "demo-env", "0.1.0")
    assert card.tags == ["demo", "math"] and card.readme.startswith("# Demo")
    hub.push(write_dists(tmp_path / "d2", "other-env", "1.0"), owner="bob")
    assert [s.name for s in hub.search()] == ["demo-env", "other-env"]
    assert [s.name for s in hub.search("bob/")] == ["other-env"]
    assert [s.name for s in hub.search("", tag="MATH")] == ["demo-env", "other-env"]
    assert hub.search("", tag="nope") == []
    files = hub.card(EnvRef("alice", "demo-env")).versions[0].files
    assert {f.packagetype for f in files} == {"bdist_wheel", "sdist"}
    with pytest.raises(HubError) as err:
        hub.card(EnvRef("bob", "demo-env"))
    assert err.value.status == 404


def test_versions_are_immutable_and_owned(hub: LocalHub, tmp_path: Path) -> None:
    hub.push(write_dists(tmp_path / "a", "demo-env", "0.1.0"))
    with pytest.raises(HubError) as err:
        hub.push(write_dists(tmp_path / "b", "demo-env", "0.1.0"))
    assert err.value.status == 409
    with pytest.raises(HubError) as err:
        hub.push(write_dists(tmp_path / "c", "demo-env", "0.2.0"), owner="mallory")
    assert err.value.status == 403
    card = hub.push(write_dists(tmp_path / "d", "demo-env", "0.2.0"))
    assert [v.version for v in card.versions] == ["0.1.0", "0.2.0"]
    assert card.latest_version == "0.2.0"


def test_concurrent_local_pushes_all_land(hub: LocalHub, tmp_path: Path) -> None:
    batches = [write_dists(tmp_path / str(i), "demo-env", f"1.{i}") for i in range(10)]
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(hub.push, batches))
    card = hub.card(EnvRef("alice", "demo-env"))
    assert sorted(v.version for v in card.versions) == sorted(f"1.{i}" for i in range(10))


def test_tampered_artifact_is_refused(hub: LocalHub, tmp_path: Path) -> None:
    hub.push(write_dists(tmp_path / "d", "demo-env", "0.1.0"))
    card = hub.card(EnvRef("alice", "demo-env"))
    wheel = next(f for f in card.versions[0].files if f.packagetype == "bdist_wheel")
    stored = hub.root / "files" / "demo-env" / wheel.filename
    stored.write_bytes(stored.read_bytes() + b"tampered")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(HubError, match="sha256 mismatch"):
        hub.download(EnvRef("alice", "demo-env"), wheel, out)
    assert not (out / wheel.filename).exists()


def test_pull_unpacks_the_sdist(hub: LocalHub, tmp_path: Path) -> None:
    hub.push(write_dists(tmp_path / "d", "demo-env", "0.1.0"))
    source = pull("alice/demo-env@0.1.0", tmp_path / "src", hub)
    assert (source / "PKG-INFO").is_file() and (source / "README.md").is_file()
    with pytest.raises(HubError, match="already exists"):
        pull("alice/demo-env", tmp_path / "src", hub)
    with pytest.raises(HubError, match="no version 9.9"):
        pull("alice/demo-env@9.9", tmp_path / "src2", hub)


def test_eval_records_attach_to_versions(hub: LocalHub, tmp_path: Path) -> None:
    hub.push(write_dists(tmp_path / "d", "demo-env", "0.1.0"))
    ref = EnvRef("alice", "demo-env")
    forged = EvalRecord(model="m", mean_reward=0.5, n=4, status="verified", id=99)
    hub.add_eval(ref, "0.1.0", forged)
    (stored,) = hub.card(ref).evals
    assert (stored.version, stored.status, stored.id) == ("0.1.0", "claimed", 1)
    with pytest.raises(HubError, match="verified only on a hub server"):
        hub.add_reproduction(ref, "0.1.0", 1, ReproductionRecord(model="m", mean_reward=0.5, n=4))
    with pytest.raises(HubError):
        hub.add_eval(ref, "9.9", EvalRecord(model="m", mean_reward=0.5, n=4))


@pytest.mark.venv  # pip download from the static index
def test_static_index_works_with_pip(hub: LocalHub, tmp_path: Path) -> None:
    hub.push(write_dists(tmp_path / "d", "demo-env", "0.1.0"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--index-url",
            hub.index_url(),
            "demo-env==0.1.0",
            "-d",
            str(tmp_path / "dl"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [p.name for p in (tmp_path / "dl").iterdir()] == ["demo_env-0.1.0-py3-none-any.whl"]


def test_open_hub_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RLKIT_HUB", raising=False)
    monkeypatch.delenv("RLKIT_HUB_TOKEN", raising=False)
    local = open_hub()
    assert isinstance(local, LocalHub) and local.root == (tmp_path / "home" / "hub").resolve()
    monkeypatch.setenv("RLKIT_HUB", "http://127.0.0.1:1")
    monkeypatch.setenv("RLKIT_HUB_TOKEN", "t0k")
    remote = open_hub()
    assert isinstance(remote, RemoteHub) and remote.index_url() == (
        "http://__token__:t0k@127.0.0.1:1/simple/"
    )
    assert isinstance(open_hub("local"), LocalHub)
    monkeypatch.delenv("RLKIT_HUB")
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "config.toml").write_text('[hub]\nurl = "https://hub.test"\n')
    assert open_hub().location == "https://hub.test"
    with pytest.raises(UsageError, match="--hub"):
        open_hub("ftp:nothing")
    with pytest.raises(HubError, match="cannot reach hub"):
        RemoteHub("http://127.0.0.1:1").search()
