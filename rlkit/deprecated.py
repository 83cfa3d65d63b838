"""Deprecated aliases for names that moved: the old import path keeps working for one release.

A module whose names moved defines `__getattr__ = moved_names(__name__, {"Old": "new.module:New"})`
(PEP 562). The alias is resolved lazily, by module name, so an old path in a lower layer never
imports the layer above it when nobody uses the alias, and each use warns once with the new path.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

REMOVED_IN = "rlkit 0.3"


def moved_names(module: str, moved: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` serving `moved` ({old name: "new.module:new name"}) with a warning."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target_module, _, target_name = moved[name].partition(":")
        warnings.warn(
            f"{module}.{name} moved to {target_module}.{target_name}; "
            f"the old name is removed in {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(target_module), target_name)

    return __getattr__
