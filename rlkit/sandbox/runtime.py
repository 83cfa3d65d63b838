"""Runtime trees: a read-only copy of a few installed pure-Python distributions (e.g. pytest)
that sandboxed programs import through `Mounts.pythonpath`.

The sandbox never sees site-packages; a program that needs a test runner gets exactly the
distributions named here plus their requirements, copied file by file from the installed
distributions' RECORD (importlib.metadata). A tree is built once per set of versions under
`workspace.base_dir()/runtime-<key>` and reused; building goes through a temporary directory
renamed into place, so concurrent builders never see half a tree.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from rlkit.sandbox.workspace import base_dir


def _closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The distributions and, recursively, their requirements (markers evaluated, no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise RuntimeError(f"runtime tree: {name!r} is not installed") from exc
        found[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(found.values(), key=lambda d: d.metadata["Name"].lower())


def _copy_files(dist: metadata.Distribution, target: Path) -> None:
    for file in dist.files or []:
        if file.parts[0].endswith((".dist-info", ".egg-info")) and file.name != "METADATA":
            continue
        if ".." in file.parts or file.suffix == ".pyc":
            continue  # console scripts outside site-packages; bytecode is rebuilt as needed
        if file.suffix in (".so", ".pyd"):
            raise RuntimeError(f"runtime tree: {dist.metadata['Name']} is not pure Python")
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            dest = target / Path(*file.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)


def runtime_tree(*names: str) -> Path:
    """The directory holding `names` and their requirements, importable inside the sandbox."""
    dists = _closure(names)
    pins = ",".join(f"{d.metadata['Name']}=={d.version}" for d in dists)
    key = hashlib.sha256(pins.encode()).hexdigest()[:16]
    tree = base_dir() / f"runtime-{key}"
    if tree.is_dir():
        return tree
    staging = Path(tempfile.mkdtemp(prefix="runtime-build-", dir=tree.parent))
    try:
        for dist in dists:
            _copy_files(dist, staging)
        (staging / "RUNTIME.txt").write_text(pins + "\n")
        staging.chmod(0o755)
        try:
            staging.rename(tree)
        except OSError:  # another process finished first: use its tree
            if not tree.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree
