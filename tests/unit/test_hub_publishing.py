"""One set of publishing rules, applied the same way by the local hub and the server's store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlkit.hub import HubError, LocalHub
from rlkit.hub.artifacts import inspect_artifact
from rlkit.hub.names import EnvRef
from rlkit.hub.publishing import files_to_add
from rlkit.hub.records import EnvCard
from rlkit.hub.server.db import make_engine
from rlkit.hub.server.store import HubStore
from tests.helpers.hub_dists import make_sdist, make_wheel

Dist = tuple[str, bytes]


class Backend:
    """`publish(owner, dists)` and `card(owner, name)` over one hub implementation."""

    publish: Callable[[str, list[Dist]], None]
    card: Callable[[str, str], EnvCard]


def local_backend(tmp_path: Path) -> Backend:
    hub = LocalHub(tmp_path / "hub")
    backend = Backend()

    def publish(owner: str, dists: list[Dist]) -> None:
        paths = []
        for filename, data in dists:
            path = tmp_path / "dists" / filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            paths.append(path)
        hub.push(paths, owner=owner)

    backend.publish = publish
    backend.card = lambda owner, name: hub.card(EnvRef(owner, name))
    return backend


def server_backend(tmp_path: Path) -> Backend:
    store = HubStore(make_engine(f"sqlite:///{tmp_path / 'hub.db'}"), tmp_path / "files")
    backend = Backend()

    def publish(owner: str, dists: list[Dist]) -> None:
        for filename, data in dists:  # the server receives one file per upload, like twine
            store.upload(owner, inspect_artifact(data, filename), data)

    backend.publish = publish
    backend.card = lambda owner, name: store.card(owner, name, viewer=owner)
    return backend


@pytest.fixture(params=[local_backend, server_backend], ids=["local", "server"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return request.param(tmp_path)


def status(call: Callable[[], None]) -> int:
    with pytest.raises(HubError) as err:
        call()
    return err.value.status


def test_both_backends_apply_the_same_rules(backend: Backend) -> None:
    wheel, sdist = make_wheel("rules-env", "1.0"), make_sdist("rules-env", "1.0")
    backend.publish("alice", [wheel])
    backend.publish("alice", [sdist])  # a second file type joins the existing version
    files = backend.card("alice", "rules-env").get_version("1.0").files
    assert {f.packagetype for f in files} == {"bdist_wheel", "sdist"}
    assert status(lambda: backend.publish("alice", [wheel])) == 409  # nothing new
    changed = make_wheel("rules-env", "1.0", readme="# changed")
    assert status(lambda: backend.publish("alice", [changed])) == 409  # same name, other bytes
    assert status(lambda: backend.publish("mallory", [make_wheel("rules-env", "2.0")])) == 403
    backend.publish("alice", [make_wheel("rules-env", "0.9", readme="# old")])
    card = backend.card("alice", "rules-env")
    assert card.latest_version == "1.0" and "old" not in card.readme  # newest describes it


def test_files_to_add_names_the_refusal() -> None:
    wheel = inspect_artifact(*reversed(make_wheel("x-env", "1.0")))
    sdist = inspect_artifact(*reversed(make_sdist("x-env", "1.0")))
    assert files_to_add("a/x-env@1.0", [], [wheel, sdist]) == [wheel, sdist]
    assert files_to_add("a/x-env@1.0", [wheel], [wheel, sdist]) == [sdist]  # resume a push
    with pytest.raises(HubError, match="already published") as err:
        files_to_add("a/x-env@1.0", [wheel, sdist], [wheel])
    assert err.value.status == 409
    with pytest.raises(HubError, match="two sdist files") as err:
        files_to_add("a/x-env@1.0", [], [sdist, sdist])
    assert err.value.status == 400
