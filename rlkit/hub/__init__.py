"""The environment hub: package, publish, install and browse environment packages.

A hub is a Python package index (PEP 503/691; uploads through the legacy API twine speaks)
plus environment cards and evaluation leaderboards. It is either a local directory (default,
no server) or a server (`rlkit hub serve`). See `rlkit.hub.names` for how OWNER/NAME maps to
index project names. Publishing eval results is `rlkit.eval.publish`.
"""

from rlkit.hub.base import Hub, HubError
from rlkit.hub.client import open_hub
from rlkit.hub.install import ensure_installed, install, install_from_index, pull
from rlkit.hub.local import LocalHub
from rlkit.hub.names import EnvRef, parse_env_id
from rlkit.hub.records import EnvCard, EnvSummary, EvalRecord
from rlkit.hub.remote import RemoteHub
from rlkit.hub.scaffold import build_env, dist_files, init_env

__all__ = [
    "EnvCard",
    "EnvRef",
    "EnvSummary",
    "EvalRecord",
    "Hub",
    "HubError",
    "LocalHub",
    "RemoteHub",
    "build_env",
    "dist_files",
    "ensure_installed",
    "init_env",
    "install",
    "install_from_index",
    "open_hub",
    "parse_env_id",
    "pull",
]
