"""The hub server's domain logic: what is visible to whom, uploads, visibility and evaluations.

Routes stay thin and call this class; every refusal is a `HubError` whose status the routes
return unchanged. Writes are serialised with one lock per process (SQLite allows one writer at
a time; unique constraints keep a multi-process PostgreSQL deployment consistent too).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rlkit.atomic import atomic_path
from rlkit.hub import publishing
from rlkit.hub.artifacts import ArtifactInfo
from rlkit.hub.base import HubError, matches
from rlkit.hub.records import (
    AuditRecord,
    EnvCard,
    EnvSummary,
    EvalRecord,
    FileRecord,
    ReproductionRecord,
    VersionRecord,
    Visibility,
    eval_status,
)
from rlkit.hub.server.db import Eval, File, Identity, Project, Release, Reproduction, identify
from rlkit.hub.simple import IndexFile, index_entries

# What an Eval row and an EvalRecord share, column for field.
EVAL_COLUMNS = (
    "model",
    "mean_reward",
    "pass_at_k",
    "n",
    "num_examples",
    "rollouts_per_example",
    "date",
)


def _visible(project: Project | None, viewer: str | None) -> bool:
    return project is not None and (project.visibility == "public" or project.owner == viewer)


def _summary_fields(project: Project) -> dict[str, Any]:
    """The columns of a project that its search row (EnvSummary) and its card share."""
    return {
        "owner": project.owner,
        "name": project.name,
        "summary": project.summary,
        "tags": list(project.tags or []),
        "latest_version": project.latest_version,
        "visibility": project.visibility,
    }


def _eval_record(version: str, row: Eval) -> EvalRecord:
    reproductions = [
        ReproductionRecord(
            model=row.model,
            mean_reward=p.mean_reward,
            n=p.n,
            date=p.date,
            metadata=p.meta,
            runner=p.runner,
            tolerance=p.tolerance,
            agrees=p.agrees,
        )
        for p in row.reproductions
    ]
    return EvalRecord(
        id=row.id,
        version=version,
        submitted_by=row.submitted_by,
        metadata=row.meta,
        rollouts=row.rollouts or [],
        status=eval_status(reproductions),
        reproductions=reproductions,
        **{column: getattr(row, column) for column in EVAL_COLUMNS},
    )


def _audit(row: Release) -> AuditRecord | None:
    """A release's stored audit; one this code cannot read shows as not audited."""
    if not row.audit:
        return None
    try:
        return AuditRecord.model_validate(row.audit)
    except ValidationError:
        return None


def _card(project: Project) -> EnvCard:
    versions = [
        VersionRecord(
            version=r.version,
            created=r.created.isoformat(timespec="seconds"),
            audit=_audit(r),
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
    evals = [_eval_record(r.version, e) for r in project.releases for e in r.evals]
    return EnvCard(
        **_summary_fields(project),
        readme=project.readme,
        readme_content_type=project.readme_content_type,
        license=project.license,
        versions=versions,
        evals=evals,
    )


class HubStore:
    """Database + artifact directory of one hub server."""

    def __init__(self, engine: Engine, files_dir: Path, verify_tolerance: float = 0.05) -> None:
        self.engine = engine
        self.files_dir = Path(files_dir)
        self.verify_tolerance = verify_tolerance
        self._write_lock = threading.Lock()

    def identify(self, token: str | None) -> Identity | None:
        """None without a token; 401 HubError for an unknown, revoked or expired one."""
        with Session(self.engine) as session:
            return identify(session, token)

    def owner_of(self, token: str | None) -> str | None:
        identity = self.identify(token)
        return identity.owner if identity else None

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
                EnvSummary(**_summary_fields(p))
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
            card = _card(self._project(session, name, viewer))
        return [v.version for v in card.versions], index_entries(card)

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
        """Store one validated file; 403 for another owner's project, 409 if already there.

        The bytes go to a private temp path, the row is committed, and only then is the file
        renamed into place: a concurrent upload that loses (another server process on the same
        database) removes only its own temp file, never a path someone else committed.
        """
        path = self.files_dir / info.name / info.filename
        with self._write_lock:
            try:
                with atomic_path(path) as tmp:
                    tmp.write_bytes(data)
                    with Session(self.engine) as session, session.begin():
                        self._add_file(session, owner, info)
            except IntegrityError as exc:
                raise HubError(f"{info.filename} already exists", 409) from exc

    def _add_file(self, session: Session, owner: str, info: ArtifactInfo) -> None:
        project = session.scalar(select(Project).where(Project.name == info.name))
        publishing.check_owner(info.name, project.owner if project else None, owner)
        if project is None:
            project = Project(name=info.name, owner=owner, tags=[])
            session.add(project)
        release = next((r for r in project.releases if r.version == info.version), None)
        label = f"{project.owner}/{info.name}@{info.version}"
        publishing.files_to_add(label, release.files if release else [], [info])
        if release is None:
            release = Release(version=info.version)
            project.releases.append(release)
        release.files.append(File(**publishing.file_fields(info)))
        project.latest_version = publishing.latest_version(r.version for r in project.releases)
        if info.version == project.latest_version:
            publishing.describe(project, info)

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

    def set_audit(
        self, owner: str, name: str, version: str, record: AuditRecord, viewer: str
    ) -> AuditRecord:
        """Attach `rlkit env audit`'s record to a version; only the environment's owner may
        (403), once per version (409: what a version was published with stays)."""
        with self._write_lock, Session(self.engine) as session, session.begin():
            project = self._project(session, name, viewer)
            release = next((r for r in project.releases if r.version == version), None)
            if project.owner != owner or release is None:
                raise HubError(f"environment {owner}/{name}@{version} not found", 404)
            if viewer != project.owner:
                raise HubError(f"only {project.owner} may record the audit of {name}", 403)
            if release.audit:
                raise HubError(f"{owner}/{name}@{version} already has its audit", 409)
            release.audit = record.model_dump(mode="json")
            return record

    def add_eval(
        self, owner: str, name: str, version: str, record: EvalRecord, viewer: str
    ) -> EvalRecord:
        with self._write_lock, Session(self.engine) as session, session.begin():
            project = self._project(session, name, viewer)
            release = next((r for r in project.releases if r.version == version), None)
            if project.owner != owner or release is None:
                raise HubError(f"environment {owner}/{name}@{version} not found", 404)
            columns = record.model_dump(include=set(EVAL_COLUMNS))
            row = Eval(
                submitted_by=viewer, meta=record.metadata, rollouts=record.rollouts, **columns
            )
            release.evals.append(row)
            session.flush()
            return _eval_record(version, row)

    def add_reproduction(
        self,
        owner: str,
        name: str,
        version: str,
        eval_id: int,
        record: ReproductionRecord,
        runner: Identity,
    ) -> EvalRecord:
        """Record `runner`'s re-run of result `eval_id`; only the environment's owner or a
        trusted runner may (403). It agrees when its mean reward is within the hub's tolerance
        of the claim, which then shows as verified."""
        with self._write_lock, Session(self.engine) as session, session.begin():
            project = self._project(session, name, runner.owner)
            release = next((r for r in project.releases if r.version == version), None)
            if project.owner != owner or release is None:
                raise HubError(f"environment {owner}/{name}@{version} not found", 404)
            if runner.owner != project.owner and not runner.trusted_runner:
                raise HubError(
                    f"only {project.owner} (the environment's owner) or a trusted runner may "
                    f"verify results; {runner.owner} is neither",
                    403,
                )
            claim = next((e for e in release.evals if e.id == eval_id), None)
            if claim is None:
                raise HubError(f"{owner}/{name}@{version} has no result {eval_id}", 404)
            if record.model != claim.model:
                raise HubError(
                    f"result {eval_id} is for model {claim.model}, not {record.model}", 400
                )
            agrees = abs(record.mean_reward - claim.mean_reward) <= self.verify_tolerance
            claim.reproductions.append(
                Reproduction(
                    runner=runner.owner,
                    mean_reward=record.mean_reward,
                    n=record.n,
                    tolerance=self.verify_tolerance,
                    agrees=agrees,
                    date=record.date,
                    meta=record.metadata,
                )
            )
            session.flush()
            return _eval_record(version, claim)
