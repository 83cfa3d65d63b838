"""Find an environment by id and build it: `load_environment("owner/my-env@1.0", **kwargs)`.

An id names a module: the `owner/` prefix and `@version` are stripped and `-` becomes `_`
(`my-env` -> `my_env`). When that module does not exist or has no `load_environment` (e.g. `math`
is the standard library's), `<name>_env` is tried, so the `math` environment lives in module
`math_env`. Modules are imported from installed packages first, then from environment folders
(`<folder>/<id>/`, added to sys.path) under `./environments`, the rlkit checkout's
`environments/` and any folder listed in `$RLKIT_ENV_PATH`. Hub ids (`owner/name`) that are not
importable are installed with `rlkit.hub.install.ensure_installed` and retried; ids are parsed by
`rlkit.hub.names.parse_env_id`, the one parser of `[OWNER/]NAME[@VERSION]`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from rlkit.envs.environment import Environment
from rlkit.errors import UsageError
from rlkit.hub.install import ensure_installed, install_from_index
from rlkit.hub.names import parse_env_id

ENV_PATH_VAR = "RLKIT_ENV_PATH"


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


def _import_env_module(name: str, candidates: list[str]) -> ModuleType | None:
    """The first of the candidate modules that provides `load_environment`, or None."""
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


def _find_local(name: str, candidates: list[str]) -> ModuleType | None:
    """Import the environment from a local folder `<env folder>/<name>/` if there is one."""
    for folder in env_folders():
        for candidate in {name, name.replace("_", "-"), name.replace("-", "_")}:
            env_dir = folder / candidate
            if not env_dir.is_dir():
                continue
            if str(env_dir) not in sys.path:
                sys.path.insert(0, str(env_dir))
            importlib.invalidate_caches()
            module = _import_env_module(name, candidates)
            if module is not None:
                return module
    return None


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


def _requirement_names(requires: list[str]) -> set[str]:
    names = set()
    for requirement in requires:
        try:
            names.add(Requirement(requirement).name)
        except InvalidRequirement:
            continue
    return names


def _package_version(module: ModuleType, name: str, local: bool) -> str | None:
    """The environment's version: its distribution's, or a local folder's pyproject.toml's.

    Distribution names like the environment's are tried first, then a pyproject.toml next to
    the module; the full module -> distribution map (`packages_distributions`, 1-2 s: it reads
    every installed package's file list; built once per process) only for an installed module
    named unlike its distribution.
    """
    top = module.__name__.split(".")[0]
    for dist_name in dict.fromkeys([name, name.replace("_", "-"), top, top.replace("_", "-")]):
        try:
            return importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    # a folder environment (also when imported before, so no longer found as `local`)
    file = Path(module.__file__ or ".").resolve()
    for folder in (file.parent, file.parent.parent):
        if (folder / "pyproject.toml").is_file():
            project = tomllib.loads((folder / "pyproject.toml").read_text()).get("project", {})
            return project.get("version")
    if local:
        return None
    for dist_name in _packages_distributions().get(top, []):
        try:
            return importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def _packages_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _unknown(env_id: str, name: str, candidates: list[str]) -> UsageError:
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


def load_environment(
    env_id: str, *, verifiers_version: str | None = None, install: bool = False, **kwargs: Any
) -> Environment:
    """Import the environment named by `env_id` and call its `load_environment(**kwargs)`.

    `env_id` is `[OWNER/]NAME[@VERSION][:MODULE]`; MODULE names the module that has
    `load_environment` when it is not named after the package. A package that requires
    `verifiers` is never imported here: it runs in a bridge worker (`rlkit.envs.bridge`) with
    the newest tested verifiers version its range allows, or `verifiers_version`. A NAME found
    nowhere is installed from the package index when `install` (the user's consent) is set.
    """
    ref = parse_env_id(env_id, require_owner=False)
    name = ref.name
    candidates = [ref.module] if ref.module else module_names(name)
    bridged = _load_bridged(name, candidates, ref.module is not None, kwargs, verifiers_version)
    if bridged is not None:
        return bridged
    if verifiers_version:
        raise UsageError(
            f"environment {name!r} does not declare a verifiers requirement; "
            "--verifiers-version applies only to verifiers environments"
        )
    module = _import_env_module(name, candidates)
    local = module is None
    module = module or _find_local(name, candidates)
    if module is None and (ref.owner or install):
        if ref.owner:
            ensure_installed(env_id)
        else:
            install_from_index(name, ref.version)
        importlib.invalidate_caches()
        bridged = _load_bridged(name, candidates, ref.module is not None, kwargs, verifiers_version)
        if bridged is not None:
            return bridged
        module, local = _import_env_module(name, candidates), False
    if module is None:
        raise _unknown(env_id, name, candidates)
    try:
        env = module.load_environment(**kwargs)
    except (TypeError, ValueError) as exc:  # unknown kwarg or a value the environment rejects
        raise UsageError(f"bad arguments for environment {name!r}: {exc}") from exc
    env = _as_rlkit_env(env, name)
    env.env_id = env.env_id or name
    env.version = env.version or _package_version(module, name, local)
    return env


def load_environment_at(path: Path, name: str, **kwargs: Any) -> Environment:
    """Load environment `name` from the package source folder `path` (ahead of installed ones).

    Used before publishing, when the package in `path` may not be installed yet.
    """
    folder = str(Path(path).resolve())
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    return load_environment(name, **kwargs)


def _load_bridged(
    name: str,
    candidates: list[str],
    explicit: bool,
    kwargs: dict[str, Any],
    verifiers_version: str | None,
) -> Environment | None:
    """A `BridgeEnv` when `name` is a verifiers environment (found without importing it)."""
    from rlkit.envs.bridge import BridgeEnv, find_verifiers_source

    source = find_verifiers_source(name, env_folders(), candidates, explicit)
    return None if source is None else BridgeEnv(source, kwargs, verifiers_version)


def _as_rlkit_env(env: Any, name: str) -> Environment:
    """Accept rlkit environments only (verifiers ones were routed to the bridge)."""
    if isinstance(env, Environment):
        return env
    raise UsageError(
        f"environment {name!r}: load_environment returned {type(env).__name__}, "
        "not an rlkit.envs.Environment"
    )
