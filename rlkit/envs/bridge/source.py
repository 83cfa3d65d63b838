"""Recognise a verifiers environment without importing it, and say how a worker gets it.

An environment is a verifiers one when its package declares a `verifiers` requirement: a local
folder's `pyproject.toml`, or an installed distribution's metadata. Local folders (and editable
installs, which point at one) are imported in the worker from their folder, with their other
requirements installed in the venv; other installed distributions (`rlkit env install` installs
a verifiers package without its dependencies) are imported through links to their top-level
modules, with their other requirements installed in the venv.
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


@dataclass
class VfSource:
    name: str
    module: str
    verifiers_spec: str  # the declared range, e.g. ">=0.1.9,<0.2"
    requirements: list[str] = field(default_factory=list)  # everything but verifiers
    sys_path: list[str] = field(default_factory=list)
    version: str | None = None
    api: str = "load_environment"  # or "taskset" (verifiers 0.4): see `env_api`


def split_requirements(requires: list[str]) -> tuple[str | None, list[str]]:
    """(verifiers specifier or None when not required, the other requirements)."""
    spec: str | None = None
    others = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            others.append(text)
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement
        if req.name.lower() == "verifiers":
            spec = str(req.specifier)
        elif req.name.lower() != "rlkit":
            others.append(text)
    return spec, others


def _module_in(folder: Path, candidates: list[str]) -> str | None:
    for module in candidates:
        if (folder / f"{module}.py").is_file() or (folder / module / "__init__.py").is_file():
            return module
    return None


def env_api(folder: Path, module: str) -> str:
    """What the module exports, read from its source without importing it: a
    `load_environment` function (verifiers up to 0.3), else a `Taskset` through `__all__`
    (verifiers 0.4 packages, which have no `load_environment`)."""
    for path in (folder / f"{module}.py", folder / module / "__init__.py"):
        if path.is_file():
            text = path.read_text(errors="replace")
            if "load_environment" not in text and re.search(r"^__all__\s*=", text, re.M):
                return "taskset"
    return "load_environment"


def from_folder(folder: Path, name: str, candidates: list[str]) -> VfSource | None:
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    spec, others = split_requirements(list(project.get("dependencies") or []))
    module = _module_in(folder, candidates)
    if spec is None or module is None:
        return None
    path = str(folder.resolve())
    api = env_api(folder, module)
    return VfSource(name, module, spec, others, [path], project.get("version"), api)


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


def from_installed(name: str, candidates: list[str]) -> VfSource | None:
    for dist_name in dict.fromkeys([name, name.replace("_", "-"), name.replace("-", "_")]):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        spec, others = split_requirements(list(dist.requires or []))
        if spec is None:
            return None
        folder = _editable_folder(dist)
        if folder is not None and (found := from_folder(folder, name, candidates)):
            return found
        link_dir = _linked_sources(dist)
        module = _module_in(link_dir, candidates) or candidates[0]
        api = env_api(link_dir, module)
        return VfSource(name, module, spec, others, [str(link_dir)], dist.version, api)
    return None


def find_verifiers_source(name: str, folders: list[Path], candidates: list[str]) -> VfSource | None:
    """The verifiers environment `name` from an installed package or a local folder, or None."""
    found = from_installed(name, candidates)
    if found is not None:
        return found
    for folder in folders:
        for sub in dict.fromkeys([name, name.replace("_", "-"), name.replace("-", "_")]):
            if (folder / sub).is_dir() and (found := from_folder(folder / sub, name, candidates)):
                return found
    return None
