"""Which verifiers versions the bridge runs, and which one an environment gets.

Each era has one shim inside the worker (`worker/shim_*.py`) and a list of exact versions the
bridge is tested with. An environment's declared range (its `verifiers` requirement) picks the
newest tested version inside it; `--verifiers-version` / `[[env]] verifiers = "..."` overrides
(any exact version of a supported era). No fit is a `UsageError` naming the installed,
required and tested versions.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rlkit.errors import UsageError


@dataclass(frozen=True)
class Era:
    name: str
    shim: str  # worker module
    first: str  # versions in [first, end) belong to this era
    end: str
    tested: tuple[str, ...]
    api: str = "load_environment"  # what its environments export: see `source.env_api`
    requirements: tuple[str, ...] = ()  # what the worker venv needs beside verifiers


ERAS = (
    Era("0.1.x classic", "shim_classic", "0.1.3", "0.1.10", ("0.1.3.post0", "0.1.9.post3")),
    Era("0.1.10-0.2.x client layer", "shim_v02", "0.1.10", "0.3", ("0.2.0",)),
    Era("0.3.x legacy", "shim_v03", "0.3", "0.4", ("0.3.1",)),
    # verifiers prepares its local chat agent (a PEP 723 script) with uv
    Era("0.4.x tasksets", "shim_v04", "0.4", "0.5", ("0.4.0",), "taskset", ("uv",)),
)


def versions_tested(api: str | None = None) -> list[str]:
    return [v for era in ERAS if api in (None, era.api) for v in era.tested]


def era_of(version: str) -> Era | None:
    v = Version(version)
    return next((e for e in ERAS if Version(e.first) <= v < Version(e.end)), None)


def _installed() -> str:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def select_version(
    env_name: str, required: str | None, override: str | None = None, api: str | None = None
) -> str:
    """The exact verifiers version to run `env_name` with (see the module docstring); `api`
    (what the environment exports) limits the choice to the eras that load that shape."""
    tested = versions_tested(api)
    shape = {"taskset": " and exports a Taskset (the 0.4 API)"}.get(api or "", "")
    if api == "load_environment":
        shape = " and defines load_environment (the 0.1-0.3 API)"
    context = (
        f"environment {env_name!r} requires verifiers {required or '(any)'}{shape}; "
        f"the bridge is tested with {', '.join(tested)} for it "
        f"(installed beside rlkit: {_installed()})"
    )
    if override:
        try:
            Version(override)
        except InvalidVersion as exc:
            raise UsageError(f"verifiers version {override!r} is not a version: {exc}") from exc
        if era_of(override) is None:
            eras = ", ".join(f"{e.name} [{e.first}, {e.end})" for e in ERAS)
            raise UsageError(f"verifiers {override} is in no supported era ({eras}); {context}")
        era = era_of(override)
        if api is not None and era is not None and era.api != api:
            raise UsageError(f"verifiers {override} ({era.name}) cannot load it: {context}")
        return override
    try:
        spec = SpecifierSet(required or "")
    except InvalidSpecifier as exc:
        raise UsageError(f"{context}: bad requirement: {exc}") from exc
    fits = [v for v in tested if spec.contains(v, prereleases=True)]
    if not fits:
        raise UsageError(
            f"no tested verifiers version fits: {context}. Pass --verifiers-version "
            '(or [[env]] verifiers = "...") to run it with another version'
        )
    return max(fits, key=Version)
