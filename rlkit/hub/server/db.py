"""The hub server's database: SQLAlchemy 2 ORM, SQLite by default, any SQLAlchemy URL works.

Only portable SQL is used (ORM queries, unique constraints, JSON columns), so the same code runs
on PostgreSQL. API tokens are stored as sha256 hashes; the token itself is shown once. A token
may expire and may be revoked; either way it is refused with a 401 that says which. A token
created as a trusted runner may record reproductions of any environment's results.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from rlkit.errors import UsageError
from rlkit.hub.base import HubError
from rlkit.hub.names import validate_owner


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Token(Base):
    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    expires: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    trusted_runner: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=False)


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)  # PEP 503 normalised
    owner: Mapped[str] = mapped_column(String(64), index=True)
    visibility: Mapped[str] = mapped_column(String(16), default="public")
    summary: Mapped[str] = mapped_column(Text, default="")
    readme: Mapped[str] = mapped_column(Text, default="")
    readme_content_type: Mapped[str] = mapped_column(String(100), default="text/markdown")
    tags: Mapped[list] = mapped_column(JSON, default=list)
    license: Mapped[str] = mapped_column(Text, default="")
    latest_version: Mapped[str] = mapped_column(String(100), default="")
    releases: Mapped[list[Release]] = relationship(
        back_populates="project", order_by="Release.id", cascade="all, delete-orphan"
    )


class Release(Base):
    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("project_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    version: Mapped[str] = mapped_column(String(100))
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    project: Mapped[Project] = relationship(back_populates="releases")
    files: Mapped[list[File]] = relationship(order_by="File.id", cascade="all, delete-orphan")
    evals: Mapped[list[Eval]] = relationship(order_by="Eval.id", cascade="all, delete-orphan")
    # `rlkit env audit` as pushed with this version (an AuditRecord's JSON); None: not audited
    audit: Mapped[dict | None] = mapped_column(JSON, nullable=True, default=None)


class File(Base):
    __tablename__ = "files"
    __table_args__ = (UniqueConstraint("release_id", "packagetype"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    release_id: Mapped[int] = mapped_column(ForeignKey("releases.id"), index=True)
    filename: Mapped[str] = mapped_column(String(300), unique=True)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    packagetype: Mapped[str] = mapped_column(String(32))
    requires_python: Mapped[str] = mapped_column(String(100), default="")
    upload_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Eval(Base):
    __tablename__ = "evals"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    release_id: Mapped[int] = mapped_column(ForeignKey("releases.id"), index=True)
    model: Mapped[str] = mapped_column(String(300))
    mean_reward: Mapped[float] = mapped_column(Float)
    pass_at_k: Mapped[dict] = mapped_column(JSON, default=dict)
    n: Mapped[int] = mapped_column(Integer)
    num_examples: Mapped[int] = mapped_column(Integer, default=0)
    rollouts_per_example: Mapped[int] = mapped_column(Integer, default=0)
    date: Mapped[str] = mapped_column(String(40))
    submitted_by: Mapped[str] = mapped_column(String(64))
    meta: Mapped[dict] = mapped_column("metadata", JSON, default=dict)
    rollouts: Mapped[list | None] = mapped_column(JSON, nullable=True, default=list)
    reproductions: Mapped[list[Reproduction]] = relationship(
        order_by="Reproduction.id", cascade="all, delete-orphan"
    )


class Reproduction(Base):
    """A re-run of a claimed result by the environment's owner or a trusted runner."""

    __tablename__ = "reproductions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    eval_id: Mapped[int] = mapped_column(ForeignKey("evals.id"), index=True)
    runner: Mapped[str] = mapped_column(String(64))
    mean_reward: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    tolerance: Mapped[float] = mapped_column(Float)
    agrees: Mapped[bool] = mapped_column(Boolean)
    date: Mapped[str] = mapped_column(String(40))
    meta: Mapped[dict] = mapped_column("metadata", JSON, default=dict)


def default_db_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'hub.db'}"


def make_engine(url: str) -> Engine:
    """Create the engine and tables; SQLite gets WAL and a busy timeout for concurrent pushes."""
    is_sqlite = url.startswith("sqlite")
    engine = create_engine(
        url, connect_args={"timeout": 30, "check_same_thread": False} if is_sqlite else {}
    )
    if is_sqlite:

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record) -> None:  # noqa: ANN001 - DBAPI connection
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA foreign_keys=ON")

    Base.metadata.create_all(engine)
    _add_missing_columns(engine)
    return engine


def _add_missing_columns(engine: Engine) -> None:
    """Add columns that newer code declares to tables an older hub created; every column added
    after a table's first release is nullable, so an ALTER TABLE ADD COLUMN is enough."""
    inspector = inspect(engine)
    with engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            present = {c["name"] for c in inspector.get_columns(table.name)}
            for column in table.columns:
                if column.name not in present:
                    kind = column.type.compile(dialect=engine.dialect)
                    conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    engine: Engine,
    owner: str,
    expires_in: timedelta | None = None,
    trusted_runner: bool = False,
) -> str:
    """Create an API token for `owner`; only its hash is stored, so print it now or lose it.

    `expires_in` None means the token never expires; `trusted_runner` lets it verify results.
    """
    validate_owner(owner)
    token = "rlkit_" + secrets.token_urlsafe(32)
    expires = _now() + expires_in if expires_in is not None else None
    with Session(engine) as session, session.begin():
        session.add(
            Token(
                owner=owner,
                token_hash=hash_token(token),
                expires=expires,
                trusted_runner=trusted_runner,
            )
        )
    return token


@dataclass(frozen=True)
class Identity:
    """Who a valid token speaks for."""

    owner: str
    trusted_runner: bool = False


def _utc(moment: datetime) -> datetime:
    """SQLite returns naive datetimes for timezone-aware columns; they were stored as UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def identify(session: Session, token: str | None) -> Identity | None:
    """The identity behind `token`; None when no token was sent. An unknown, revoked or
    expired token is a 401 whose message says which, so a client never mistakes a dead
    token for anonymous access."""
    if not token:
        return None
    row = session.scalar(select(Token).where(Token.token_hash == hash_token(token)))
    if row is None:
        raise HubError("invalid API token", 401)
    if row.revoked is not None:
        stamp = _utc(row.revoked).isoformat(timespec="seconds")
        raise HubError(f"API token revoked on {stamp}: create a new one", 401)
    if row.expires is not None and _utc(row.expires) <= _now():
        stamp = _utc(row.expires).isoformat(timespec="seconds")
        raise HubError(f"API token expired on {stamp}: create a new one", 401)
    return Identity(row.owner, bool(row.trusted_runner))


def revoke_token(engine: Engine, token: str | None = None, token_id: int | None = None) -> str:
    """Revoke one token, given as the token itself or its id; returns its owner."""
    if (token is None) == (token_id is None):
        raise UsageError("give exactly one of TOKEN or --id")
    where = Token.id == token_id if token is None else Token.token_hash == hash_token(token)
    with Session(engine) as session, session.begin():
        row = session.scalar(select(Token).where(where))
        if row is None:
            raise UsageError("no such token")
        if row.revoked is None:
            row.revoked = _now()
        return row.owner


def list_tokens(engine: Engine) -> list[dict]:
    """Every token's id, owner, role and dates (never the token, which is not stored)."""
    with Session(engine) as session:
        rows = session.scalars(select(Token).order_by(Token.id)).all()
        return [
            {
                "id": r.id,
                "owner": r.owner,
                "trusted_runner": bool(r.trusted_runner),
                "created": _utc(r.created).isoformat(timespec="seconds"),
                "expires": _utc(r.expires).isoformat(timespec="seconds") if r.expires else None,
                "revoked": _utc(r.revoked).isoformat(timespec="seconds") if r.revoked else None,
            }
            for r in rows
        ]
