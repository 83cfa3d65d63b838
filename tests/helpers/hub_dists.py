"""Small, valid (or deliberately broken) wheels and sdists built in memory for hub tests.

Building with `python -m build` takes seconds per package; these take microseconds, so tests
can push dozens of versions. The files are real archives pip can install.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile

README = "# Demo\n\nA demo environment."


def metadata(
    name: str,
    version: str,
    readme: str = README,
    keywords: str = "demo,math",
    requires: tuple[str, ...] = (),
) -> str:
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    return (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: {name} for tests\nKeywords: {keywords}\nLicense: MIT\n"
        f"Requires-Python: >=3.11\n{deps}Description-Content-Type: text/markdown\n\n{readme}"
    )


def make_wheel(
    name: str,
    version: str,
    readme: str = README,
    extra: dict[str, bytes] | None = None,
    requires: tuple[str, ...] = (),
) -> tuple[str, bytes]:
    """(filename, bytes) of a pure-Python wheel with one module `<name>_mod`, depending on
    `requires` (PEP 508 strings)."""
    stem = name.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    files = {
        f"{stem}_mod/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": metadata(name, version, readme, requires=requires).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        **(extra or {}),
    }
    record = (
        "".join(
            f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip('=')},{len(data)}\n"
            for path, data in files.items()
        )
        + f"{info}/RECORD,,\n"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", record)
    return f"{stem}-{version}-py3-none-any.whl", buffer.getvalue()


def make_sdist(name: str, version: str, readme: str = README) -> tuple[str, bytes]:
    """(filename, bytes) of a PEP 625 sdist with PKG-INFO."""
    top = f"{name.replace('-', '_')}-{version}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, data in {
            f"{top}/PKG-INFO": metadata(name, version, readme).encode(),
            f"{top}/README.md": readme.encode(),
        }.items():
            member = tarfile.TarInfo(path)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return f"{top}.tar.gz", buffer.getvalue()
