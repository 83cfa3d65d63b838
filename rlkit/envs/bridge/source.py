"""Recognise a verifiers environment without importing it, and say how a worker gets it.

An environment is a verifiers one when its package declares a `verifiers` requirement (also
only in an extra): a local folder's `pyproject.toml`, or an installed distribution's metadata.
Its entry module is the one the user names (`NAME:pkg.module`), else the template's (named
after the distribution), else the one module found defining `load_environment`. Local folders
(and editable installs, which point at one) are imported in the worker from their folder (or
its `src/`), with their other requirements installed in the venv; other installed
distributions (`rlkit env install` installs a verifiers package without its dependencies) are
imported through links to their top-level modules, with their other requirements installed in
the venv.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from rlkit.errors import UsageError


@dataclass
class VfSource:
    name: str
    module: str
    verifiers_spec: str  # the declared range, e.g. ">=0.1.9,<0.2"
    requirements: list[str] = field(default_factory=list)  # everything but verifiers
    sys_path: list[str] = field(default_factory=list)
    version: str | None = None
    api: str = "load_environment"  # or "taskset" (verifiers 0.4): see `env_api`


def _split(requires: list[str], extra: str) -> tuple[str | None, list[str]]:
    """(verifiers specifier or None, the other requirements) that apply with `extra` ("" for
    the base requirements; an extra's list also holds the base ones in dist metadata)."""
    spec: str | None = None
    others = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            others.append(text)
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue  # another extra's requirement, or not for this platform
        if req.name.lower() == "verifiers":
            spec = str(req.specifier)
        elif req.name.lower() != "rlkit":
            if extra:  # the marker matched: pip would skip `dep; extra == "vf"` as a plain install
                req.marker = None
            others.append(str(req) if extra else text)
    return spec, others


def split_requirements(
    requires: list[str], extras: dict[str, list[str]] | None = None
) -> tuple[str | None, list[str]]:
    """(verifiers specifier or None when not required, the other requirements). Packages that
    list verifiers only in an extra (`pip install pkg[vf]`) count too: the first extra that
    requires it supplies the specifier and its other requirements."""
    spec, others = _split(requires, "")
    if spec is not None:
        return spec, others
    for extra, extra_requires in (extras or {}).items():
        spec, more = _split(extra_requires, extra)
        if spec is not None:
            return spec, list(dict.fromkeys([*others, *more]))
    return None, others


def _module_file(root: Path, module: str) -> Path | None:
    base = root / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_in(roots: list[Path], candidates: list[str]) -> tuple[Path, str] | None:
    """(root, module) of the first candidate module found under one of the roots."""
    for module in candidates:
        for root in roots:
            if _module_file(root, module) is not None:
                return root, module
    return None


# not where a package keeps its entry module (`src/` is searched as a root of its own)
SKIPPED_DIRS = {"tests", "test", "build", "dist", "docs", "examples", "src", "venv", "__pycache__"}
LOAD_ENVIRONMENT = re.compile(r"^(async\s+)?def\s+load_environment\s*\(", re.M)


def discover_modules(root: Path, max_depth: int = 4) -> list[str]:
    """Modules under `root` that define a top-level `load_environment`, read as text (never
    imported), shallowest first: where a package that is not laid out as `vf-init` makes it
    (no module named after the distribution, the function in a submodule)."""
    found: list[tuple[int, str]] = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        depth = len(Path(folder).relative_to(root).parts)
        dirs[:] = sorted(
            d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".") and depth < max_depth
        )
        for file in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / file
            if not LOAD_ENVIRONMENT.search(path.read_text(errors="replace")):
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts and all(part.isidentifier() for part in parts):
                found.append((len(parts), ".".join(parts)))
    return [module for _, module in sorted(found)]


def entry_module(
    roots: list[Path], candidates: list[str], explicit: bool, name: str
) -> tuple[Path, str]:
    """Where `name`'s `load_environment` (or 0.4 taskset) lives: a candidate module (the
    explicit `NAME:module`, else the template's names), else the one module found defining
    `load_environment`. Nothing, or several equally likely: a `UsageError` listing where rlkit
    looked."""
    hit = _module_in(roots, candidates)
    if hit is not None:
        return hit
    where = ", ".join(str(r) for r in roots)
    if explicit:
        raise UsageError(f"environment {name!r}: no module {candidates[0]!r} in {where}")
    found = [(root, module) for root in roots for module in discover_modules(root)]
    depth = min((m.count(".") for _, m in found), default=0)
    best = [(root, m) for root, m in found if m.count(".") == depth]
    if len(best) == 1:
        return best[0]
    looked = (
        f"modules {', '.join(candidates)} and any module defining load_environment under {where}"
    )
    if not best:
        raise UsageError(
            f"verifiers environment {name!r}: no load_environment found (looked for {looked})"
        )
    modules = ", ".join(m for _, m in best)
    raise UsageError(
        f"verifiers environment {name!r}: several modules define load_environment ({modules}); "
        f"pick one with {name}:MODULE"
    )


def env_api(folder: Path, module: str) -> str:
    """What the module exports, read from its source without importing it: a
    `load_environment` function (verifiers up to 0.3), else a `Taskset` through `__all__`
    (verifiers 0.4 packages, which have no `load_environment`)."""
    path = _module_file(folder, module)
    if path is not None:
        text = path.read_text(errors="replace")
        if "load_environment" not in text and re.search(r"^__all__\s*=", text, re.M):
            return "taskset"
    return "load_environment"


def from_folder(
    folder: Path, name: str, candidates: list[str], explicit: bool = False
) -> VfSource | None:
    """The verifiers environment in a package folder (its module at the top or under `src/`),
    or None when the folder's package does not require verifiers."""
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    extras = dict(project.get("optional-dependencies") or {})
    spec, others = split_requirements(list(project.get("dependencies") or []), extras)
    if spec is None:
        return None
    roots = [r.resolve() for r in (folder, folder / "src") if r.is_dir()]
    root, module = entry_module(roots, candidates, explicit, name)
    api = env_api(root, module)
    return VfSource(name, module, spec, others, [str(root)], project.get("version"), api)


def _editable_folder(dist: importlib.metadata.Distribution) -> Path | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    data = json.loads(text)
    url = str(data.get("url", ""))
    if (data.get("dir_info") or {}).get("editable") and url.startswith("file://"):
        return Path(url[len("file://") :])
    return None


def _linked_sources(dist: importlib.metadata.Distribution) -> Path:
    """A folder holding links to the distribution's top-level modules only: the worker imports
    the installed package from there without seeing the rest of rlkit's site-packages. One
    folder per installation (the same release installed in two venvs gets two), each link
    replaced atomically when it points elsewhere (a venv deleted and made anew)."""
    from rlkit.envs.bridge.venvs import venvs_root

    site = str(dist.locate_file(""))
    digest = hashlib.sha256(site.encode()).hexdigest()[:10]
    folder = venvs_root().parent / "src" / f"{dist.metadata['Name']}-{dist.version}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    tops = {
        f.parts[0]
        for f in dist.files or []
        if f.parts
        and f.parts[0] not in ("..", "__pycache__")
        and not f.parts[0].endswith((".dist-info", ".data", ".pth"))
    }
    for top in tops:
        link, target = folder / top, Path(str(dist.locate_file(top)))
        if link.is_symlink() and link.readlink() == target:
            continue
        fresh = folder / f".{top}.{os.getpid()}"
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(target)
        os.replace(fresh, link)
    return folder


def _dist_extras(dist: importlib.metadata.Distribution) -> dict[str, list[str]]:
    requires = list(dist.requires or [])
    return {extra: requires for extra in dist.metadata.get_all("Provides-Extra") or []}


def from_installed(name: str, candidates: list[str], explicit: bool = False) -> VfSource | None:
    for dist_name in dict.fromkeys([name, name.replace("_", "-"), name.replace("-", "_")]):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if split_requirements(list(dist.requires or []), _dist_extras(dist))[0] is None:
            return None
        folder = _editable_folder(dist)
        if folder is not None and (found := from_folder(folder, name, candidates, explicit)):
            return found
        return _dist_source(dist, _linked_sources(dist), name, candidates, explicit)
    return None


def _dist_source(
    dist: importlib.metadata.Distribution,
    root: Path,
    name: str,
    candidates: list[str],
    explicit: bool,
) -> VfSource | None:
    """The verifiers environment of a distribution whose modules are under `root`."""
    spec, others = split_requirements(list(dist.requires or []), _dist_extras(dist))
    if spec is None:
        return None
    root, module = entry_module([root], candidates, explicit, name)
    api = env_api(root, module)
    return VfSource(name, module, spec, others, [str(root)], dist.version, api)


def from_unpacked_wheel(
    folder: Path, name: str, candidates: list[str], explicit: bool = False
) -> VfSource | None:
    """The verifiers environment of a wheel unpacked into `folder` (`rlkit env doctor`)."""
    infos = sorted(folder.glob("*.dist-info"))
    if not infos:
        raise UsageError(f"{folder} holds no *.dist-info: not an unpacked wheel")
    dist = importlib.metadata.PathDistribution(infos[0])
    return _dist_source(dist, folder, name, candidates, explicit)


def find_verifiers_source(
    name: str, folders: list[Path], candidates: list[str], explicit: bool = False
) -> VfSource | None:
    """The verifiers environment `name` from an installed package or a local folder, or None.
    `explicit`: `candidates` is the one module the user named (`NAME:module`)."""
    found = from_installed(name, candidates, explicit)
    if found is not None:
        return found
    for folder in folders:
        for sub in dict.fromkeys([name, name.replace("_", "-"), name.replace("-", "_")]):
            if (folder / sub).is_dir() and (
                found := from_folder(folder / sub, name, candidates, explicit)
            ):
                return found
    return None
