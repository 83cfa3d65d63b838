"""The embedded default hub: a directory (``$RLKIT_HOME/hub``) that needs no server.

Layout: ``projects/<name>.json`` (the environment card), ``files/<name>/<file>`` (artifacts) and
a static PEP 503 index under ``simple/`` regenerated on every push, so
``pip install --index-url file://<root>/simple NAME`` works too. Writes hold an exclusive file
lock and go through `rlkit.atomic.atomic_write`, so concurrent pushes never leave half-written
state.
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlkit.atomic import atomic_write
from rlkit.hub import publishing
from rlkit.hub.artifacts import ArtifactError, ArtifactInfo, inspect_artifact
from rlkit.hub.base import HubError, download_path, matches
from rlkit.hub.names import EnvRef, validate_owner
from rlkit.hub.records import (
    AuditRecord,
    EnvCard,
    EnvSummary,
    EvalRecord,
    FileRecord,
    ReproductionRecord,
    VersionRecord,
    Visibility,
)
from rlkit.hub.simple import (
    hashes_from_project_page,
    index_entries,
    project_list_html,
    project_page_html,
)


def default_owner() -> str:
    """Owner for local pushes: $RLKIT_HUB_OWNER, else the login name made slug-safe."""
    owner = os.environ.get("RLKIT_HUB_OWNER") or getpass.getuser()
    return "".join(c if c.isalnum() else "-" for c in owner.lower()).strip("-") or "local"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class LocalHub:
    """A directory hub; every reader and writer on this machine sees everything in it."""

    def __init__(self, root: Path, owner: str | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.location = str(self.root)
        self.owner = owner

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _card_path(self, name: str) -> Path:
        return self.root / "projects" / f"{name}.json"

    def _load(self, name: str) -> EnvCard | None:
        path = self._card_path(name)
        return EnvCard.model_validate_json(path.read_text()) if path.is_file() else None

    def _save(self, card: EnvCard) -> None:
        atomic_write(self._card_path(card.name), card.model_dump_json(indent=2).encode())

    def push(
        self,
        files: list[Path],
        owner: str | None = None,
        visibility: Visibility | None = None,
        audit: AuditRecord | None = None,
    ) -> EnvCard:
        owner = validate_owner(owner or self.owner or default_owner())
        infos: list[tuple[bytes, ArtifactInfo]] = []  # the bytes checked are the bytes stored
        for path in files:
            data = Path(path).read_bytes()
            try:
                infos.append((data, inspect_artifact(data, Path(path).name)))
            except ArtifactError as exc:
                raise HubError(str(exc), 400) from exc
        if not infos or len({(i.name, i.version) for _, i in infos}) != 1:
            raise HubError("push needs files of exactly one name and version", 400)
        first = infos[0][1]
        with self._locked():
            card = self._load(first.name)
            publishing.check_owner(first.name, card.owner if card else None, owner)
            card = card or EnvCard(owner=owner, name=first.name)
            release = card.get_version(first.version)
            label = f"{owner}/{first.name}@{first.version}"
            new = publishing.files_to_add(
                label, release.files if release else [], [i for _, i in infos]
            )
            if release is None:
                release = VersionRecord(version=first.version)
                card.versions.append(release)
            new_names = {i.filename for i in new}
            for data, info in infos:
                if info.filename not in new_names:
                    continue
                atomic_write(self.root / "files" / info.name / info.filename, data)
                release.files.append(FileRecord(**publishing.file_fields(info)))
            if audit is not None and release.audit is None:
                release.audit = audit
            card.latest_version = publishing.latest_version(v.version for v in card.versions)
            if card.latest_version == first.version:
                publishing.describe(card, first)
            if visibility:
                card.visibility = visibility
            self._save(card)
            self._write_index(card)
        return card

    def _write_index(self, card: EnvCard) -> None:
        page = project_page_html(card.name, index_entries(card)).encode()
        atomic_write(self.root / "simple" / card.name / "index.html", page)
        names = sorted(p.stem for p in (self.root / "projects").glob("*.json"))
        atomic_write(self.root / "simple" / "index.html", project_list_html(names).encode())

    def card(self, ref: EnvRef) -> EnvCard:
        card = self._load(ref.name)
        if card is None or (ref.owner and card.owner != ref.owner):
            raise HubError(f"environment {ref.owner}/{ref.name} not found on {self.location}", 404)
        return card

    def search(self, query: str = "", tag: str | None = None) -> list[EnvSummary]:
        cards = [
            EnvCard.model_validate_json(p.read_text())
            for p in sorted((self.root / "projects").glob("*.json"))
        ]
        rows = [EnvSummary(**c.model_dump(include=set(EnvSummary.model_fields))) for c in cards]
        return [r for r in rows if matches(r, query, tag)]

    def download(self, ref: EnvRef, file: FileRecord, dest_dir: Path) -> Path:
        source = download_path(self.root / "files" / ref.name, file.filename)
        if not source.is_file():
            raise HubError(f"{file.filename} is missing from {self.location}", 404)
        dest = download_path(dest_dir, file.filename)
        shutil.copyfile(source, dest)
        if sha256_file(dest) != file.sha256:
            dest.unlink()
            raise HubError(f"sha256 mismatch for {file.filename}: the artifact was altered", 400)
        return dest

    def add_eval(self, ref: EnvRef, version: str, record: EvalRecord) -> EvalRecord:
        """Append a claimed result (the hub, not the caller, sets id, status and submitter)."""
        with self._locked():
            card = self.card(ref)
            if card.get_version(version) is None:
                raise HubError(f"{ref.owner}/{ref.name} has no version {version}", 404)
            record = record.model_copy(
                update={
                    "id": len(card.evals) + 1,
                    "version": version,
                    "submitted_by": self.owner or default_owner(),
                    "status": "claimed",
                    "reproductions": [],
                }
            )
            card.evals.append(record)
            self._save(card)
        return record

    def add_reproduction(
        self, ref: EnvRef, version: str, eval_id: int, record: ReproductionRecord
    ) -> EvalRecord:
        raise HubError(
            f"{self.location} is a directory anyone with write access can edit: results are "
            "verified only on a hub server (rlkit hub serve)",
            400,
        )

    def index_hashes(self, name: str) -> dict[str, str] | None:
        page = self.root / "simple" / name / "index.html"
        return hashes_from_project_page(page.read_text()) if page.is_file() else None

    def index_projects(self) -> set[str]:
        simple = self.root / "simple"
        return {p.name for p in simple.iterdir() if p.is_dir()} if simple.is_dir() else set()

    def index_url(self) -> str:
        return (self.root / "simple").as_uri()
