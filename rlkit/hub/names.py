"""Environment ids and package names.

An environment on a hub is addressed as ``OWNER/NAME[@VERSION]``. The index project name is the
distribution's own name, PEP 503 normalised (``My_Env`` -> ``my-env``), and the owner is recorded
next to it: the first owner to publish a name claims it on that hub, so ``alice/my-env`` resolves
to index project ``my-env`` only while alice owns it. Keeping the distribution name (rather than
renaming it ``alice-my-env``) is what lets ``pip install --index-url HUB/simple my-env`` and
``import my_env`` keep working with unmodified wheels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rlkit.errors import UsageError

# PEP 508 project names: letters/digits, inner '.', '_' or '-'; no path separators.
_NAME_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_OWNER_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")


def normalize(name: str) -> str:
    """PEP 503 normalised project name (the index key)."""
    return canonicalize_name(name)


def module_name(name: str) -> str:
    """The importable module of an environment package: ``my-env`` -> ``my_env``."""
    return normalize(name).replace("-", "_")


def validate_name(name: str) -> str:
    """Return the normalised package name or raise UsageError naming the problem."""
    if not _NAME_RE.match(name or ""):
        raise UsageError(
            f"invalid environment name {name!r}: use letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit (no path separators)"
        )
    return normalize(name)


def validate_owner(owner: str) -> str:
    """Owners are lower-case slugs (letters, digits, inner '-'), at most 40 characters."""
    if not _OWNER_RE.match(owner or ""):
        raise UsageError(
            f"invalid owner {owner!r}: use lower-case letters, digits and inner '-' (max 40)"
        )
    return owner


def validate_version(version: str) -> str:
    """A PEP 440 version, returned in its normalised form."""
    try:
        return str(Version(version))
    except InvalidVersion as exc:
        raise UsageError(f"invalid version {version!r}: not a PEP 440 version") from exc


@dataclass(frozen=True)
class EnvRef:
    """A parsed ``OWNER/NAME[@VERSION]``; `name` is normalised, `version` may be None."""

    owner: str
    name: str
    version: str | None = None
    module: str | None = None  # `NAME:pkg.mod`: the module that has load_environment

    def __str__(self) -> str:
        base = f"{self.owner}/{self.name}"
        return f"{base}@{self.version}" if self.version else base


_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_env_id(env_id: str, *, require_owner: bool = True) -> EnvRef:
    """Parse ``OWNER/NAME[@VERSION][:MODULE]``; raises UsageError for anything else. MODULE (a
    dotted module path) names where a package that does not follow the template keeps its
    `load_environment`."""
    text = env_id.strip()
    version = module = None
    if ":" in text:
        text, module = text.split(":", 1)
        if not _MODULE_RE.match(module):
            raise UsageError(
                f"environment id {env_id!r}: {module!r} after ':' is not a dotted module path "
                "(NAME:package.module)"
            )
    if "@" in text:
        text, version = text.rsplit("@", 1)
        version = validate_version(version)
    if "/" not in text:
        if require_owner:
            raise UsageError(f"environment id {env_id!r} must look like OWNER/NAME[@VERSION]")
        return EnvRef(owner="", name=validate_name(text), version=version, module=module)
    owner, _, name = text.partition("/")
    if "/" in name:
        raise UsageError(f"environment id {env_id!r} must look like OWNER/NAME[@VERSION]")
    return EnvRef(validate_owner(owner), validate_name(name), version, module)
