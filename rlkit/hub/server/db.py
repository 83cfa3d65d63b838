"""The hub server's database: SQLAlchemy 2 ORM, SQLite by default, any SQLAlchemy URL works.

Only portable SQL is used (ORM queries, unique constraints, JSON columns), so the same code runs
on PostgreSQL. API tokens are stored as sha256 hashes; the token itself is shown once.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

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
    return engine


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(engine: Engine, owner: str) -> str:
    """Create an API token for `owner`; only its hash is stored, so print it now or lose it."""
    validate_owner(owner)
    token = "rlkit_" + secrets.token_urlsafe(32)
    with Session(engine) as session, session.begin():
        session.add(Token(owner=owner, token_hash=hash_token(token)))
    return token


def owner_for_token(session: Session, token: str | None) -> str | None:
    """The owner a token belongs to, or None for a missing or unknown token."""
    if not token:
        return None
    row = session.scalar(select(Token).where(Token.token_hash == hash_token(token)))
    return row.owner if row else None
