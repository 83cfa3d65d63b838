"""The hub server's domain logic: what is visible to whom, uploads, visibility and evaluations.

Routes stay thin and call this class; every refusal is a `HubError` whose status the routes
return unchanged. Writes are serialised with one lock per process (SQLite allows one writer at
a time; unique constraints keep a multi-process PostgreSQL deployment consistent too).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from packaging.version import Version
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rlkit.hub.artifacts import ArtifactInfo
from rlkit.hub.base import HubError, matches
from rlkit.hub.records import (
    EnvCard,
    EnvSummary,
    EvalRecord,
    FileRecord,
    VersionRecord,
    Visibility,
)
from rlkit.hub.server.db import Eval, File, Project, Release, owner_for_token
from rlkit.hub.simple import IndexFile


def _visible(project: Project | None, viewer: str | None) -> bool:
    return project is not None and (project.visibility == "public" or project.owner == viewer)


def _card(project: Project) -> EnvCard:
    versions = [
        VersionRecord(
            version=r.version,
            created=r.created.isoformat(timespec="seconds"),
            files=[
                FileRecord(
                    filename=f.filename,
                    sha256=f.sha256,
                    size=f.size,
                    packagetype=f.packagetype,
                    requires_python=f.requires_python,
                    upload_time=f.upload_time.isoformat(timespec="seconds"),
                )
                for f in r.files
            ],
        )
        for r in project.releases
    ]
    evals = [
        EvalRecord(
            version=r.version,
            model=e.model,
            mean_reward=e.mean_reward,
            pass_at_k=e.pass_at_k,
            n=e.n,
            num_examples=e.num_examples,
            rollouts_per_example=e.rollouts_per_example,
            date=e.date,
            submitted_by=e.submitted_by,
            metadata=e.meta,
        )
        for r in project.releases
        for e in r.evals
    ]
    return EnvCard(
        owner=project.owner,
        name=project.name,
        summary=project.summary,
        tags=list(project.tags or []),
        latest_version=project.latest_version,
        visibility=project.visibility,  # type: ignore[arg-type]
        readme=project.readme,
        readme_content_type=project.readme_content_type,
        license=project.license,
        versions=versions,
        evals=evals,
    )


class HubStore:
    """Database + artifact directory of one hub server."""

    def __init__(self, engine: Engine, files_dir: Path) -> None:
        self.engine = engine
        self.files_dir = Path(files_dir)
        self._write_lock = threading.Lock()

    def owner_of(self, token: str | None) -> str | None:
        with Session(self.engine) as session:
            return owner_for_token(session, token)

    def _project(self, session: Session, name: str, viewer: str | None) -> Project:
        project = session.scalar(select(Project).where(Project.name == name))
        if not _visible(project, viewer):
            raise HubError(f"environment {name} not found", 404)
        return project  # type: ignore[return-value]

    def search(
        self, viewer: str | None, query: str = "", tag: str | None = None
    ) -> list[EnvSummary]:
        with Session(self.engine) as session:
            projects = session.scalars(select(Project).order_by(Project.name)).all()
            rows = [
                EnvSummary(
                    owner=p.owner,
                    name=p.name,
                    summary=p.summary,
                    tags=list(p.tags or []),
                    latest_version=p.latest_version,
                    visibility=p.visibility,  # type: ignore[arg-type]
                )
                for p in projects
                if p.latest_version and _visible(p, viewer)
            ]
        return [r for r in rows if matches(r, query, tag)]

    def card(self, owner: str, name: str, viewer: str | None) -> EnvCard:
        with Session(self.engine) as session:
            project = self._project(session, name, viewer)
            if project.owner != owner or not project.latest_version:
                raise HubError(f"environment {owner}/{name} not found", 404)
            return _card(project)

    def index_files(self, name: str, viewer: str | None) -> tuple[list[str], list[IndexFile]]:
        """Versions and files of a project for its simple-index page (relative file URLs)."""
        with Session(self.engine) as session:
            project = self._project(session, name, viewer)
            files = [
                IndexFile(
                    filename=f.filename,
                    url=f"../../files/{project.name}/{f.filename}",
                    sha256=f.sha256,
                    size=f.size,
                    requires_python=f.requires_python,
                    upload_time=f.upload_time.isoformat(timespec="seconds"),
                )
                for r in project.releases
                for f in r.files
            ]
            return [r.version for r in project.releases], files

    def project_names(self, viewer: str | None) -> list[str]:
        return [s.name for s in self.search(viewer)]

    def file_path(self, name: str, filename: str, viewer: str | None) -> Path:
        with Session(self.engine) as session:
            project = self._project(session, name, viewer)
            row = session.scalar(
                select(File)
                .join(Release)
                .where(Release.project_id == project.id, File.filename == filename)
            )
            if row is None:
                raise HubError(f"file {filename} not found", 404)
            return self.files_dir / project.name / row.filename

    def upload(self, owner: str, info: ArtifactInfo, data: bytes) -> None:
        """Store one validated file; 403 for another owner's project, 409 if already there."""
        path = self.files_dir / info.name / info.filename
        written = False  # only a file this call wrote may be removed on failure
        with self._write_lock:
            try:
                with Session(self.engine) as session, session.begin():
                    self._add_file(session, owner, info, path, data)
                    written = True
            except IntegrityError as exc:
                if written:
                    path.unlink(missing_ok=True)
                raise HubError(f"{info.filename} already exists", 409) from exc
            except BaseException:
                if written:
                    path.unlink(missing_ok=True)
                raise

    def _add_file(
        self, session: Session, owner: str, info: ArtifactInfo, path: Path, data: bytes
    ) -> None:
        project = session.scalar(select(Project).where(Project.name == info.name))
        if project is None:
            project = Project(name=info.name, owner=owner, tags=[])
            session.add(project)
        elif project.owner != owner:
            raise HubError(f"{info.name} belongs to owner {project.owner}, not {owner}", 403)
        if session.scalar(select(File).where(File.filename == info.filename)) is not None:
            raise HubError(f"{info.filename} already exists: published files are immutable", 409)
        release = next((r for r in project.releases if r.version == info.version), None)
        if release is None:
            release = Release(version=info.version)
            project.releases.append(release)
        elif any(f.packagetype == info.packagetype for f in release.files):
            raise HubError(
                f"{info.name} {info.version} already has a {info.packagetype}: "
                "published versions are immutable",
                409,
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        release.files.append(
            File(
                filename=info.filename,
                sha256=info.sha256,
                size=info.size,
                packagetype=info.packagetype,
                requires_python=info.requires_python,
            )
        )
        latest = max([r.version for r in project.releases], key=Version)
        project.latest_version = latest
        if info.version == latest:  # the newest release describes the environment
            project.summary, project.readme = info.summary, info.readme
            project.readme_content_type = info.readme_content_type
            project.tags, project.license = info.keywords, info.license

    def set_visibility(self, owner: str, name: str, viewer: str, visibility: Visibility) -> None:
        """Create (claim) or update a project's visibility; only its owner may."""
        if owner != viewer:
            raise HubError(f"token of {viewer} cannot manage namespace {owner}", 403)
        with self._write_lock, Session(self.engine) as session, session.begin():
            project = session.scalar(select(Project).where(Project.name == name))
            if project is None:
                session.add(Project(name=name, owner=owner, visibility=visibility, tags=[]))
            elif project.owner != owner:
                raise HubError(f"{name} belongs to owner {project.owner}", 403)
            else:
                project.visibility = visibility

    def add_eval(
        self, owner: str, name: str, version: str, record: EvalRecord, viewer: str
    ) -> EvalRecord:
        with self._write_lock, Session(self.engine) as session, session.begin():
            project = self._project(session, name, viewer)
            release = next((r for r in project.releases if r.version == version), None)
            if project.owner != owner or release is None:
                raise HubError(f"environment {owner}/{name}@{version} not found", 404)
            release.evals.append(
                Eval(
                    model=record.model,
                    mean_reward=record.mean_reward,
                    pass_at_k=record.pass_at_k,
                    n=record.n,
                    num_examples=record.num_examples,
                    rollouts_per_example=record.rollouts_per_example,
                    date=record.date,
                    submitted_by=viewer,
                    meta=record.metadata,
                )
            )
        return record.model_copy(update={"version": version, "submitted_by": viewer})
