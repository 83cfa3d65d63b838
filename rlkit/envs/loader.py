"""Build an environment from its id: `load_environment("owner/my-env@1.0", **kwargs)`.

The id is resolved once (`rlkit.envs.resolve.resolve_env_id`: where the package is, which module,
its version); this module only builds what the record names: a bridged (verifiers) package runs
in a `BridgeEnv` worker, any other is imported and its `load_environment(**kwargs)` called. A
local folder's module is imported from its folder, which then stays on `sys.path` (the
environment's own worker processes import it by name).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

from rlkit.envs.bridge import BridgeEnv
from rlkit.envs.environment import Environment
from rlkit.envs.resolve import ResolvedEnv, resolve_env_id, resolve_folder
from rlkit.errors import UsageError


def load_environment(
    env_id: str, *, verifiers_version: str | None = None, install: bool = False, **kwargs: Any
) -> Environment:
    """Resolve `env_id` and build it (`load_resolved`).

    `env_id` is `[OWNER/]NAME[@VERSION][:MODULE]` or a package folder; MODULE names the module
    that has `load_environment` when it is not named after the package. A NAME found nowhere is
    installed from the package index when `install` (the user's consent) is set.
    """
    return load_resolved(
        resolve_env_id(env_id, install=install), verifiers_version=verifiers_version, **kwargs
    )


def load_environment_at(path: Path, name: str, **kwargs: Any) -> Environment:
    """Load environment `name` from the package source folder `path` (ahead of installed ones).

    Used before publishing, when the package in `path` may not be installed yet.
    """
    return load_resolved(resolve_folder(Path(path), name), **kwargs)


def load_resolved(
    resolved: ResolvedEnv, *, verifiers_version: str | None = None, **kwargs: Any
) -> Environment:
    """Build the environment `resolved` names with `kwargs`.

    A verifiers package is never imported here: it runs in a bridge worker with the newest
    tested verifiers version its range allows, or `verifiers_version`.
    """
    if resolved.bridge is not None:
        return BridgeEnv(resolved.bridge, kwargs, verifiers_version)
    if verifiers_version:
        raise UsageError(
            f"environment {resolved.name!r} does not declare a verifiers requirement; "
            "--verifiers-version applies only to verifiers environments"
        )
    module = _import(resolved)
    check_env_args(resolved.name, module.load_environment, kwargs)
    try:
        env = module.load_environment(**kwargs)
    except (TypeError, ValueError) as exc:  # unknown kwarg or a value the environment rejects
        raise UsageError(f"bad arguments for environment {resolved.name!r}: {exc}") from exc
    if not isinstance(env, Environment):  # verifiers ones were routed to the bridge
        raise UsageError(
            f"environment {resolved.name!r}: load_environment returned {type(env).__name__}, "
            "not an rlkit.envs.Environment"
        )
    env.env_id = env.env_id or resolved.name
    env.version = env.version or resolved.version
    return env


def check_env_args(name: str, loader: Any, kwargs: dict[str, Any]) -> None:
    """Refuse a key `load_environment` does not take, naming the closest ones it does (`did
    you mean min_len?`) and all it takes; a loader with **kwargs takes anything."""
    try:
        params = inspect.signature(loader).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for key in kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=2, cutoff=0.5)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise UsageError(
                f"environment {name!r} takes no argument {key!r}: {hint}"
                f"its load_environment takes {', '.join(known) or 'no arguments'}"
            )


def _import(resolved: ResolvedEnv) -> Any:
    """The module with `load_environment`; a local folder goes first on `sys.path`."""
    if resolved.import_path is not None:
        folder = str(resolved.import_path)
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
    try:
        module = importlib.import_module(resolved.module)
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"environment {resolved.name!r} failed to import: missing module {exc.name!r}"
        ) from exc
    if not callable(getattr(module, "load_environment", None)):
        raise UsageError(
            f"environment {resolved.name!r}: module {resolved.module} has no load_environment "
            f"(name another with {resolved.name}:package.module)"
        )
    return module
