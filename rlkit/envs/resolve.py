"""Resolve an environment id once: where its package is, which module loads it, its version and
its declared eval defaults, in one record (`ResolvedEnv`) that the loader, `rlkit eval`'s
package defaults, `rlkit env check` and `rlkit env doctor` all read.

An id is `[OWNER/]NAME[@VERSION][:MODULE]` (`rlkit.hub.names.parse_env_id`) or a package
folder (`./my-env`, a path holding a pyproject.toml). NAME names a module: `-` becomes `_`, and
when that module does not exist or has no `load_environment` (`math` is the standard library's)
`<name>_env` is tried, so the `math` environment lives in module `math_env`. Where it is looked
for, in order:

- a verifiers package (declares a `verifiers` requirement; installed or in an environment
  folder): `bridged`, never imported here (it runs in a bridge worker),
- an installed module: `installed`,
- an environment folder `<folder>/<NAME>/` under `./environments`, the rlkit checkout's
  `environments/` or any folder in `$RLKIT_ENV_PATH`: `local` (found without touching
  `sys.path`; the loader imports it from `import_path`),
- with an owner, or with `install` (the user's consent), the hub or package index, installed
  now: `hub` (or `bridged`, when what came is a verifiers package).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.machinery
import importlib.metadata
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from rlkit.envs.bridge.source import VfSource, find_verifiers_source, from_folder
from rlkit.errors import UsageError
from rlkit.hub.install import ensure_installed, install_from_index
from rlkit.hub.names import parse_env_id
from rlkit.hub.wheel_defaults import read_installed_defaults

ENV_PATH_VAR = "RLKIT_ENV_PATH"

EnvSource = Literal["local", "installed", "hub", "bridged"]


@dataclass(frozen=True)
class ResolvedEnv:
    """Where an environment id leads; made by `resolve_env_id`, read by everyone after it."""

    env_id: str  # as the user wrote it
    name: str  # the package name (no owner, version or module)
    source: EnvSource
    module: str  # the module that has `load_environment` (bridged: the worker's entry module)
    version: str | None  # the package's version, when known
    project: Path | None  # the package's folder (with its pyproject.toml), when at hand
    import_path: Path | None = None  # local: the folder `module` is imported from
    bridge: VfSource | None = None  # bridged: how a worker gets the package
    eval_defaults: Mapping[str, Any] = field(default_factory=dict)  # [tool.rlkit.eval]

    @property
    def pyproject(self) -> Path | None:
        return None if self.project is None else self.project / "pyproject.toml"

    def describe(self) -> str:
        """One line for reports: what was found where."""
        where = {
            "local": f"local folder {self.project or self.import_path}",
            "installed": "installed package",
            "hub": "installed from the hub / package index",
            "bridged": f"verifiers package (imported from {', '.join(self.bridge.sys_path)})"
            if self.bridge
            else "verifiers package",
        }[self.source]
        version = f" {self.version}" if self.version else ""
        return f"{self.name}{version}: {where}, module {self.module}"


def module_names(name: str) -> list[str]:
    """Candidate module names for an environment name."""
    base = name.replace("-", "_")
    return [base, f"{base}_env"]


def env_folders() -> list[Path]:
    """Folders that hold one sub-folder per local environment, most specific first."""
    folders = [Path(p) for p in os.environ.get(ENV_PATH_VAR, "").split(os.pathsep) if p]
    folders += [Path.cwd() / "environments", Path(__file__).resolve().parents[2] / "environments"]
    unique: list[Path] = []
    for folder in folders:
        if folder.is_dir() and folder.resolve() not in [u.resolve() for u in unique]:
            unique.append(folder)
    return unique


def list_environments() -> list[str]:
    """Names of local environment folders and installed packages that depend on rlkit."""
    names = {
        p.name
        for folder in env_folders()
        for p in folder.iterdir()
        if p.is_dir() and (p / "pyproject.toml").exists()
    }
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name != "rlkit" and "rlkit" in _requirement_names(dist.requires or []):
            names.add(name)
    return sorted(names)


def resolve_env_id(env_id: str, *, install: bool = False) -> ResolvedEnv:
    """The one resolution of `env_id` (see the module docstring); a UsageError when unknown."""
    if _is_folder(env_id):
        return resolve_folder(Path(env_id))
    ref = parse_env_id(env_id, require_owner=False)
    candidates = [ref.module] if ref.module else module_names(ref.name)
    found = _find(env_id, ref.name, candidates, ref.module is not None)
    if found is None and (ref.owner or install):
        if ref.owner:
            ensure_installed(env_id)
        else:
            install_from_index(ref.name, ref.version)
        importlib.invalidate_caches()
        found = _find(env_id, ref.name, candidates, ref.module is not None, fresh=True)
    if found is None:
        raise _unknown(env_id, ref.name, candidates)
    return found


def resolve_folder(folder: Path, name: str | None = None) -> ResolvedEnv:
    """The environment package in `folder` (before publishing, or a folder id), ahead of any
    installed one; `name` defaults to the folder's project name."""
    folder = folder.resolve()
    project = _read_pyproject(folder / "pyproject.toml")
    name = name or str((project.get("project") or {}).get("name") or folder.name)
    candidates = module_names(name)
    bridge = from_folder(folder, name, candidates)
    if bridge is not None:
        return _bridged(str(folder), bridge, folder)
    for root in (folder, folder / "src"):
        module = _module_in(root, candidates)
        if module is not None:
            return _record(str(folder), name, "local", module, folder, import_path=root)
    raise UsageError(
        f"{folder}: no module {' or '.join(candidates)} (at the top or under src/) to load "
        f"environment {name!r} from"
    )


def _is_folder(env_id: str) -> bool:
    """A path (`./x`, `/x`, `a/b` that exists) to a package folder rather than a hub id."""
    path = Path(env_id).expanduser()
    pathlike = env_id.startswith((".", "/", "~")) or os.sep in env_id
    return pathlike and (path / "pyproject.toml").is_file()


def _find(
    env_id: str, name: str, candidates: list[str], explicit: bool, fresh: bool = False
) -> ResolvedEnv | None:
    """Bridged, installed, then local; `fresh`: just installed from the hub or index."""
    bridge = find_verifiers_source(name, env_folders(), candidates, explicit)
    if bridge is not None:
        return _bridged(env_id, bridge, _bridge_project(bridge))
    module = _importable(name, candidates)
    if module is not None:
        file = Path(module.__file__ or ".").resolve()
        project = _project_folder(file, {name, module.__name__})
        source: EnvSource = "hub" if fresh else "installed"
        version = _installed_version(module.__name__, name, project)
        found = _record(env_id, name, source, module.__name__, project, version=version)
        if found.eval_defaults or project is not None:
            return found
        # installed from a wheel: the defaults `rlkit env build` put in its metadata
        defaults = read_installed_defaults(_dist_names(module.__name__, name))
        return dataclasses.replace(found, eval_defaults=defaults)
    for folder in env_folders():
        for sub in dict.fromkeys([name, name.replace("_", "-"), name.replace("-", "_")]):
            module_name = _module_in(folder / sub, candidates)
            if module_name is not None:
                env_dir = folder / sub
                project = env_dir if (env_dir / "pyproject.toml").is_file() else None
                return _record(env_id, name, "local", module_name, project, import_path=env_dir)
    return None


def _record(
    env_id: str,
    name: str,
    source: EnvSource,
    module: str,
    project: Path | None,
    *,
    import_path: Path | None = None,
    version: str | None = None,
) -> ResolvedEnv:
    pyproject = _read_pyproject(project / "pyproject.toml") if project else {}
    return ResolvedEnv(
        env_id=env_id,
        name=name,
        source=source,
        module=module,
        version=version or (pyproject.get("project") or {}).get("version"),
        project=project,
        import_path=import_path,
        eval_defaults=_eval_table(pyproject),
    )


def _bridged(env_id: str, bridge: VfSource, project: Path | None) -> ResolvedEnv:
    pyproject = _read_pyproject(project / "pyproject.toml") if project else {}
    return ResolvedEnv(
        env_id=env_id,
        name=bridge.name,
        source="bridged",
        module=bridge.module,
        version=bridge.version,
        project=project,
        bridge=bridge,
        eval_defaults=_eval_table(pyproject),
    )


def _bridge_project(bridge: VfSource) -> Path | None:
    """A bridged package's folder when it is a source folder (local or editable)."""
    for root in map(Path, bridge.sys_path):
        for folder in (root, root.parent):
            if (folder / "pyproject.toml").is_file():
                return folder
    return None


def _module_in(root: Path, candidates: list[str]) -> str | None:
    """The first candidate module whose top-level package or file is in `root` (not imported:
    the path finder looks in `root` alone)."""
    if not root.is_dir():
        return None
    for candidate in candidates:
        top = candidate.split(".")[0]
        if importlib.machinery.PathFinder.find_spec(top, [str(root)]) is not None:
            return candidate
    return None


def _importable(name: str, candidates: list[str]) -> Any:
    """The first installed candidate module that provides `load_environment`, or None."""
    for module_name in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # the environment exists but its dependency is missing
                raise UsageError(
                    f"environment {name!r} failed to import: missing module {exc.name!r}"
                ) from exc
            continue
        if callable(getattr(module, "load_environment", None)):
            return module
    return None


def _project_folder(file: Path, names: set[str]) -> Path | None:
    """The folder of the pyproject.toml (up to three levels above `file`) naming one of `names`."""
    wanted = {canonicalize_name(n) for n in names}
    for folder in list(file.parents)[:3]:
        path = folder / "pyproject.toml"
        if path.is_file():
            project = _read_pyproject(path).get("project") or {}
            return folder if canonicalize_name(project.get("name", "")) in wanted else None
    return None


def _project_version(project: Path | None) -> str | None:
    if project is None:
        return None
    return (_read_pyproject(project / "pyproject.toml").get("project") or {}).get("version")


def _installed_version(module: str, name: str, project: Path | None) -> str | None:
    """The distribution's version (names like the environment's), else the project folder's,
    else (a module named unlike its distribution) through the module -> distribution map
    (1-2 s: it reads every installed package's file list; built once per process)."""
    names = _dist_names(module, name)
    return (
        _dist_version(names)
        or _project_version(project)
        or _dist_version(_packages_distributions().get(module.split(".")[0], []))
    )


def _dist_names(module: str, name: str) -> list[str]:
    """Distribution names an environment's package may go by."""
    top = module.split(".")[0]
    return list(dict.fromkeys([name, name.replace("_", "-"), top, top.replace("_", "-")]))


def _dist_version(names: Iterable[str]) -> str | None:
    for dist_name in names:
        try:
            return importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def _packages_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _read_pyproject(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from exc


def _eval_table(pyproject: dict[str, Any]) -> dict[str, Any]:
    return dict(pyproject.get("tool", {}).get("rlkit", {}).get("eval", {}))


def _requirement_names(requires: list[str]) -> set[str]:
    names = set()
    for requirement in requires:
        try:
            names.add(Requirement(requirement).name)
        except InvalidRequirement:
            continue
    return names


def _unknown(env_id: str, name: str, candidates: list[str]) -> UsageError:
    if (Path.cwd() / env_id / "pyproject.toml").is_file():  # `rlkit env init NAME`'s folder
        return UsageError(
            f"unknown environment {env_id!r}; the package folder here is named by its path: "
            f"./{env_id}"
        )
    known = list_environments()
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listing = f" Known environments: {', '.join(known)}." if known and not close else ""
    folders = ", ".join(str(f / name) for f in env_folders()) or "none"
    looked = (
        f" Looked for: an installed distribution {name!r}; importable module(s) "
        f"{', '.join(candidates)} defining load_environment; environment folders {folders} "
        f"(add folders with ${ENV_PATH_VAR}). A package whose load_environment lives elsewhere: "
        f"{name}:package.module. One from the package index: rlkit env install {name}, or "
        "rlkit eval --install."
    )
    return UsageError(f"unknown environment {env_id!r}{hint}{listing}{looked}")
