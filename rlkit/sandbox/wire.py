"""The sandbox service's JSON messages (`rlkit sandbox serve` and its client): no pickle, and
file contents as base64 so bytes and text travel alike."""

from __future__ import annotations

import base64
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# How long a request may wait for a free slot before the service answers 429 (client default).
DEFAULT_MAX_QUEUE_S = 60.0


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunRequest(Message):
    """`POST /run`: one program in a fresh sandbox (the arguments of `rlkit.sandbox.run`)."""

    code: str
    language: Literal["python", "bash"] = "python"
    stdin: str = ""
    timeout: float = Field(10.0, gt=0)
    memory_mb: int = Field(512, gt=0)
    files: dict[str, str] = Field(default_factory=dict, description="name -> base64 content")
    max_queue_s: float = Field(DEFAULT_MAX_QUEUE_S, ge=0)


class SessionRequest(Message):
    """`POST /sessions`: a persistent interpreter (the arguments of `PythonSession`)."""

    timeout: float = Field(10.0, gt=0)
    memory_mb: int = Field(512, gt=0)
    output_limit: int = Field(16384, gt=0)
    lifetime_cpu_s: float = Field(600.0, gt=0)
    files: dict[str, str] = Field(default_factory=dict, description="name -> base64 content")


class CellRequest(Message):
    """`POST /sessions/{id}/execute`: one cell in that session's namespace."""

    code: str
    timeout: float | None = Field(None, gt=0)
    max_queue_s: float = Field(DEFAULT_MAX_QUEUE_S, ge=0)


def encode_files(files: dict[str, str | bytes] | None) -> dict[str, str]:
    return {
        name: base64.b64encode(content.encode() if isinstance(content, str) else content).decode()
        for name, content in (files or {}).items()
    }


def decode_files(files: dict[str, str]) -> dict[str, str | bytes]:
    """The files as bytes; ValueError for content that is not base64."""
    try:
        return {name: base64.b64decode(content, validate=True) for name, content in files.items()}
    except ValueError as exc:
        raise ValueError(f"files: content is not base64 ({exc})") from None
