"""Validation and metadata extraction for uploaded distribution files (wheels and sdists).

Both hubs (local directory and server) accept only files that are what they claim to be: a
well-formed wheel (zip with a ``*.dist-info/METADATA``) or a PEP 625 sdist (``.tar.gz`` with
``PKG-INFO``), whose file name, archive members and core metadata agree, and whose members cannot
escape an extraction directory. Anything else raises `ArtifactError` (HTTP 400 on the server).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from packaging.metadata import parse_email
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)


class ArtifactError(ValueError):
    """The file is not an acceptable wheel or sdist; the message says why."""


@dataclass
class ArtifactInfo:
    """What a hub records about one distribution file."""

    filename: str
    name: str  # normalised project name
    version: str
    packagetype: str  # "bdist_wheel" or "sdist"
    sha256: str
    size: int
    summary: str = ""
    readme: str = ""
    readme_content_type: str = "text/markdown"
    keywords: list[str] = field(default_factory=list)
    license: str = ""
    requires_python: str = ""
    requires_dist: list[str] = field(default_factory=list)


def check_filename(filename: str) -> None:
    """Reject anything that is not a bare wheel/sdist file name (no paths, no traversal)."""
    if not filename or filename != PurePosixPath(filename).name or "\\" in filename:
        raise ArtifactError(f"invalid file name {filename!r}: must be a bare file name")
    if filename.startswith(".") or any(ord(c) < 32 for c in filename):
        raise ArtifactError(f"invalid file name {filename!r}")
    if not (filename.endswith(".whl") or filename.endswith(".tar.gz")):
        raise ArtifactError(f"{filename!r}: only wheels (.whl) and sdists (.tar.gz) are accepted")


def _check_member(member: str, filename: str) -> None:
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts or "\\" in member:
        raise ArtifactError(f"{filename}: unsafe archive member {member!r}")


def _wheel_metadata(data: bytes, filename: str) -> bytes:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArtifactError(f"{filename}: not a valid wheel (zip) archive") from exc
    with archive:
        names = archive.namelist()
        for member in names:
            _check_member(member, filename)
        if archive.testzip() is not None:
            raise ArtifactError(f"{filename}: corrupt wheel (CRC mismatch)")
        meta = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        wheel = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/WHEEL")]
        if len(meta) != 1 or len(wheel) != 1:
            raise ArtifactError(f"{filename}: wheel has no single .dist-info/METADATA and WHEEL")
        return archive.read(meta[0])


def _sdist_metadata(data: bytes, filename: str, top: str) -> bytes:
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
        members = archive.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArtifactError(f"{filename}: not a valid sdist (.tar.gz) archive") from exc
    with archive:
        for member in members:
            _check_member(member.name, filename)
            if not (member.isfile() or member.isdir()):
                raise ArtifactError(f"{filename}: links and special files are not allowed")
            if PurePosixPath(member.name).parts[0] != top:
                raise ArtifactError(f"{filename}: every member must be under {top}/")
        try:
            handle = archive.extractfile(f"{top}/PKG-INFO")
        except KeyError:
            handle = None
        if handle is None:
            raise ArtifactError(f"{filename}: sdist has no {top}/PKG-INFO")
        return handle.read()


def inspect_artifact(data: bytes, filename: str) -> ArtifactInfo:
    """Validate one wheel or sdist given as bytes and return its recorded metadata."""
    check_filename(filename)
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
            raw_meta = _wheel_metadata(data, filename)
            packagetype = "bdist_wheel"
        else:
            name, version = parse_sdist_filename(filename)
            raw_meta = _sdist_metadata(data, filename, filename[: -len(".tar.gz")])
            packagetype = "sdist"
    except (InvalidWheelFilename, InvalidSdistFilename) as exc:
        raise ArtifactError(f"invalid distribution file name {filename!r}: {exc}") from exc
    raw, _ = parse_email(raw_meta)
    meta_name, meta_version = raw.get("name", ""), raw.get("version", "")
    if canonicalize_name(meta_name) != name or meta_version != str(version):
        raise ArtifactError(
            f"{filename}: metadata says {meta_name} {meta_version}, file name says {name} {version}"
        )
    return ArtifactInfo(
        filename=filename,
        name=str(name),
        version=str(version),
        packagetype=packagetype,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        summary=raw.get("summary", ""),
        readme=raw.get("description", ""),
        readme_content_type=raw.get("description_content_type", "text/markdown"),
        keywords=[k.strip() for k in raw.get("keywords", []) if k.strip()],
        license=raw.get("license_expression") or raw.get("license", ""),
        requires_python=raw.get("requires_python", ""),
        requires_dist=list(raw.get("requires_dist", [])),
    )
