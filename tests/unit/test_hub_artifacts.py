"""Hub building blocks: env ids, artifact validation, README sanitising, simple-index pages."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

from rlkit.errors import UsageError
from rlkit.hub.artifacts import ArtifactError, inspect_artifact
from rlkit.hub.names import EnvRef, module_name, parse_env_id, validate_name
from rlkit.hub.readme import render_readme
from rlkit.hub.simple import IndexFile, project_page_html, project_page_json
from tests.helpers.hub_dists import make_sdist, make_wheel


def test_env_ids_parse_and_normalise() -> None:
    assert parse_env_id("alice/My_Env@0.1") == EnvRef("alice", "my-env", "0.1")
    assert parse_env_id("alice/my-env") == EnvRef("alice", "my-env", None)
    assert parse_env_id("my-env", require_owner=False).owner == ""
    assert module_name("My.Env") == "my_env"


@pytest.mark.parametrize(
    "bad", ["my-env", "alice/../x", "a/b/c", "Alice/x", "alice/x@not a version", "alice/"]
)
def test_bad_env_ids_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_env_id(bad)


@pytest.mark.parametrize("bad", ["../evil", "a/b", "-x", "x-", "", "a b", "a\\b"])
def test_bad_package_names(bad: str) -> None:
    with pytest.raises(UsageError, match="invalid environment name"):
        validate_name(bad)


def test_valid_wheel_and_sdist_metadata() -> None:
    filename, data = make_wheel("demo-env", "1.2.0")
    info = inspect_artifact(data, filename)
    assert (info.name, info.version, info.packagetype) == ("demo-env", "1.2.0", "bdist_wheel")
    assert info.keywords == ["demo", "math"] and info.readme.startswith("# Demo")
    assert len(info.sha256) == 64 and info.size == len(data)
    filename, data = make_sdist("demo-env", "1.2.0")
    assert inspect_artifact(data, filename).packagetype == "sdist"


@pytest.mark.parametrize(
    "filename",
    [
        "../demo_env-1.0-py3-none-any.whl",
        "x/demo_env-1.0-py3-none-any.whl",
        "..\\a.whl",
        ".hidden.whl",
        "demo_env-1.0.zip",
        "demo_env.exe",
        "not-a-wheel-name.whl",
    ],
)
def test_bad_file_names_are_refused(filename: str) -> None:
    _, data = make_wheel("demo-env", "1.0")
    with pytest.raises(ArtifactError):
        inspect_artifact(data, filename)


def test_non_archives_and_mismatches_are_refused() -> None:
    with pytest.raises(ArtifactError, match="not a valid wheel"):
        inspect_artifact(b"this is not a zip", "demo_env-1.0-py3-none-any.whl")
    with pytest.raises(ArtifactError, match="not a valid sdist"):
        inspect_artifact(b"\x1f\x8bgarbage", "demo_env-1.0.tar.gz")
    _, data = make_wheel("demo-env", "1.0")
    with pytest.raises(ArtifactError, match="metadata says"):
        inspect_artifact(data, "demo_env-2.0-py3-none-any.whl")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("demo_env/__init__.py", "")
    with pytest.raises(ArtifactError, match="METADATA"):
        inspect_artifact(buffer.getvalue(), "demo_env-1.0-py3-none-any.whl")


def test_traversal_members_are_refused() -> None:
    filename, data = make_wheel("demo-env", "1.0", extra={"../../etc/evil": b"x"})
    with pytest.raises(ArtifactError, match="unsafe archive member"):
        inspect_artifact(data, filename)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        link = tarfile.TarInfo("demo_env-1.0/PKG-INFO")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    with pytest.raises(ArtifactError, match="links"):
        inspect_artifact(buffer.getvalue(), "demo_env-1.0.tar.gz")


def test_readme_injection_renders_inert() -> None:
    html = render_readme(
        "# T\n<script>alert(1)</script>\n\n<img src=x onerror=alert(1)>\n\n"
        "[click](javascript:alert(1)) [ok](https://example.org)"
    )
    assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
    assert "&lt;script&gt;" in html and 'href="https://example.org"' in html


def test_simple_page_carries_hashes() -> None:
    files = [IndexFile("a-1.0.tar.gz", "../../files/a/a-1.0.tar.gz", "ab" * 32, 10, ">=3.11")]
    page = project_page_html("a", files)
    assert 'href="../../files/a/a-1.0.tar.gz#sha256=' + "ab" * 32 + '"' in page
    assert 'data-requires-python="&gt;=3.11"' in page
    doc = project_page_json("a", ["1.0"], files)
    assert doc["files"][0]["hashes"] == {"sha256": "ab" * 32} and doc["meta"]["api-version"]
