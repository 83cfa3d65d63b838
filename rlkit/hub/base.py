"""What every hub offers the CLI and library, whether a local directory or a server."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rlkit.errors import UsageError
from rlkit.hub.names import EnvRef
from rlkit.hub.records import EnvCard, EnvSummary, EvalRecord, FileRecord, Visibility


class HubError(UsageError):
    """A request the hub refused; `status` mirrors the HTTP status (404, 409, 403, ...)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Hub(Protocol):
    """A place environments are pushed to and installed from."""

    location: str

    def push(
        self, files: list[Path], owner: str | None = None, visibility: Visibility | None = None
    ) -> EnvCard: ...

    def card(self, ref: EnvRef) -> EnvCard: ...

    def search(self, query: str = "", tag: str | None = None) -> list[EnvSummary]: ...

    def download(self, ref: EnvRef, file: FileRecord, dest_dir: Path) -> Path:
        """Copy one file into `dest_dir` and verify its recorded sha256 (HubError if not)."""
        ...

    def add_eval(self, ref: EnvRef, version: str, record: EvalRecord) -> EvalRecord: ...

    def index_url(self) -> str:
        """The PEP 503 index pip should use for this hub's packages."""
        ...


def matches(summary: EnvSummary, query: str, tag: str | None) -> bool:
    """Search rule shared by both hubs: substring of owner/name or summary, exact tag."""
    q = query.lower().strip()
    text = f"{summary.owner}/{summary.name} {summary.summary}".lower()
    if q and q not in text:
        return False
    return tag is None or tag.lower() in (t.lower() for t in summary.tags)
