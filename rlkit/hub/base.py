"""What every hub offers the CLI and library, whether a local directory or a server."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rlkit.errors import UsageError
from rlkit.hub.artifacts import ArtifactError, check_filename
from rlkit.hub.names import EnvRef
from rlkit.hub.records import (
    AuditRecord,
    EnvCard,
    EnvSummary,
    EvalRecord,
    FileRecord,
    ReproductionRecord,
    Visibility,
)


class HubError(UsageError):
    """A request the hub refused; `status` mirrors the HTTP status (404, 409, 403, ...)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Hub(Protocol):
    """A place environments are pushed to and installed from."""

    location: str

    def push(
        self,
        files: list[Path],
        owner: str | None = None,
        visibility: Visibility | None = None,
        audit: AuditRecord | None = None,
    ) -> EnvCard:
        """Publish one version's files; `audit` (`rlkit env audit`'s record) is attached to
        that version when it has none yet."""
        ...

    def card(self, ref: EnvRef) -> EnvCard: ...

    def search(self, query: str = "", tag: str | None = None) -> list[EnvSummary]: ...

    def download(self, ref: EnvRef, file: FileRecord, dest_dir: Path) -> Path:
        """Copy one file into `dest_dir` and verify its recorded sha256 (HubError if not)."""
        ...

    def add_eval(self, ref: EnvRef, version: str, record: EvalRecord) -> EvalRecord: ...

    def add_reproduction(
        self, ref: EnvRef, version: str, eval_id: int, record: ReproductionRecord
    ) -> EvalRecord:
        """Record a re-run of result `eval_id` (owner or trusted runner only; server hubs)."""
        ...

    def index_projects(self) -> set[str]:
        """The normalised names of every project the hub's index lists (for this caller)."""
        ...

    def index_url(self) -> str:
        """The PEP 503 index pip should use for this hub's packages."""
        ...

    def index_hashes(self, name: str) -> dict[str, str] | None:
        """{filename: sha256} from project `name`'s simple-index page; None when the index
        has no such project."""
        ...


def download_path(dest_dir: Path, filename: str) -> Path:
    """Where a download named `filename` goes: refused unless it is a bare wheel/sdist name
    (the server's own rule), so a hostile card cannot write outside `dest_dir`."""
    try:
        check_filename(filename)
    except ArtifactError as exc:
        raise HubError(f"the hub served an unsafe file name: {exc}", 400) from exc
    return Path(dest_dir) / filename


def matches(summary: EnvSummary, query: str, tag: str | None) -> bool:
    """Search rule shared by both hubs: substring of owner/name or summary, exact tag."""
    q = query.lower().strip()
    text = f"{summary.owner}/{summary.name} {summary.summary}".lower()
    if q and q not in text:
        return False
    return tag is None or tag.lower() in (t.lower() for t in summary.tags)
