"""Which hub a command talks to: ``--hub URL|local|DIR``, else ``$RLKIT_HUB``, else
``[hub] url`` in ``$RLKIT_HOME/config.toml``, else the local directory hub
``$RLKIT_HOME/hub`` (``RLKIT_HOME`` defaults to ``~/.rlkit``).

The API token comes from ``--token``, else ``$RLKIT_HUB_TOKEN``, else ``[hub] token`` in the
config file; the local hub's owner from ``$RLKIT_HUB_OWNER``, ``[hub] owner``, or the login name.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from rlkit.errors import UsageError
from rlkit.hub.base import Hub
from rlkit.hub.local import LocalHub
from rlkit.hub.remote import RemoteHub


def rlkit_home() -> Path:
    return Path(os.environ.get("RLKIT_HOME") or "~/.rlkit").expanduser()


def hub_config() -> dict[str, Any]:
    """The ``[hub]`` table of ``$RLKIT_HOME/config.toml`` (empty when there is none)."""
    path = rlkit_home() / "config.toml"
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text()).get("hub", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from exc
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [hub] must be a table")
    return table


def open_hub(hub: str | None = None, token: str | None = None) -> Hub:
    """The hub named by `hub` (or the configured default) as a `Hub` object."""
    config = hub_config()
    spec = (hub or os.environ.get("RLKIT_HUB") or config.get("url") or "local").strip()
    if spec == "local":
        return LocalHub(rlkit_home() / "hub", owner=config.get("owner"))
    if spec.startswith(("http://", "https://")):
        return RemoteHub(spec, token or os.environ.get("RLKIT_HUB_TOKEN") or config.get("token"))
    if spec.startswith("file://"):
        return LocalHub(Path(spec.removeprefix("file://")), owner=config.get("owner"))
    if "/" in spec or Path(spec).is_dir():
        return LocalHub(Path(spec), owner=config.get("owner"))
    raise UsageError(f"--hub {spec!r}: expected 'local', a directory, or an http(s):// URL")
