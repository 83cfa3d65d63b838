"""The publishing rules every hub applies: the local directory hub, the server, and the client.

- The first owner to publish a name claims it; anyone else is refused (403).
- Published files are immutable: a file name, once stored, always holds the same bytes (409).
- A version holds at most one file of each type (`bdist_wheel`, `sdist`). A file of a type the
  version lacks may join it later: twine uploads one file per request, so the wheel and the
  sdist of one push arrive separately, and an interrupted push is completed by pushing again.
- Pushing files a version already holds, and nothing new, is refused (409 "already published").
- The newest version describes the environment (summary, readme, tags, license).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from packaging.version import Version

from rlkit.hub.artifacts import ArtifactInfo
from rlkit.hub.base import HubError


class PublishedFile(Protocol):
    """What the rules read of a stored file (a card's FileRecord or the server's File row)."""

    filename: str
    sha256: str
    packagetype: str


F = TypeVar("F", bound=PublishedFile)


def check_owner(name: str, claimed_by: str | None, owner: str) -> None:
    """403 unless `owner` may publish `name` (unclaimed, or already theirs)."""
    if claimed_by is not None and claimed_by != owner:
        raise HubError(f"{name} belongs to owner {claimed_by}, not {owner}", 403)


def files_to_add(label: str, present: Iterable[PublishedFile], pushed: Sequence[F]) -> list[F]:
    """The pushed files that version `label` does not hold yet; 409 when the rules refuse."""
    stored = {f.filename: f for f in present}
    types = {f.packagetype: f.filename for f in stored.values()}
    seen: set[str] = set()
    for file in pushed:
        if file.packagetype in seen:
            raise HubError(f"{label}: the push has two {file.packagetype} files", 400)
        seen.add(file.packagetype)
        old = stored.get(file.filename)
        if old is not None and old.sha256 != file.sha256:
            raise HubError(f"{label} is already published with different files (immutable)", 409)
        if old is None and file.packagetype in types:
            raise HubError(
                f"{label} already has a {file.packagetype} ({types[file.packagetype]}): "
                "published versions are immutable",
                409,
            )
    new = [f for f in pushed if f.filename not in stored]
    if not new:
        raise HubError(f"{label} is already published (versions are immutable)", 409)
    return new


def file_fields(info: ArtifactInfo) -> dict[str, Any]:
    """What both backends record about a stored file (a FileRecord's or File row's columns)."""
    return {
        "filename": info.filename,
        "sha256": info.sha256,
        "size": info.size,
        "packagetype": info.packagetype,
        "requires_python": info.requires_python,
    }


def latest_version(versions: Iterable[str]) -> str:
    """The highest PEP 440 version."""
    return str(max(versions, key=Version))


def describe(target: Any, info: ArtifactInfo) -> None:
    """Copy the environment's description from the newest version's metadata onto `target`
    (an EnvCard or the server's Project row; both use these attribute names)."""
    target.summary, target.readme = info.summary, info.readme
    target.readme_content_type = info.readme_content_type
    target.tags, target.license = info.keywords, info.license
