"""Named, pluggable functions with typed parameters (policy losses, advantage estimators,
optimisers) and classes (rollout schedulers, sandbox backends).

A `Registry` maps a name to a function and the pydantic model of that function's parameters,
in the style of verl's `register_policy_loss`. A config names a built-in (`"icepop"`), an
installed entry point (group `rlkit.losses` / `rlkit.advantages`, pointing at a function), or a
function in the user's own importable module (`"my_pkg.my_loss:fn"`), so adding one needs no
edit of rlkit. A function decorated with `registry.register(...)` carries its parameter model;
a plain function takes the registry's base parameters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from rlkit.config import field_errors

F = TypeVar("F", bound=Callable[..., Any])
ENTRY_ATTR = "__rlkit_entry__"


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered function: its name, the callable, its parameter model, fixed options."""

    name: str
    fn: F
    params: type[BaseModel]
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self, values: dict[str, Any], where: str = "params") -> BaseModel:
        """`values` as this function's parameter model; a ValueError names each bad field."""
        try:
            return self.params.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{where}.{loc}: {msg}" for loc, msg in field_errors(self.params, exc)
            )
            raise ValueError(f"{problems} ({self.name!r})") from None


class Registry(Generic[F]):
    """Built-in functions by name, plus entry points and `module:function` paths on lookup."""

    def __init__(
        self, kind: str, group: str, base_params: type[BaseModel], form: str = "module:function"
    ) -> None:
        self.kind = kind
        self.group = group
        self.base_params = base_params
        self.form = form  # how an error message spells a path to the user's own object
        self._entries: dict[str, Entry[F]] = {}

    def register(
        self, name: str, params: type[BaseModel] | None = None, **options: Any
    ) -> Callable[[F], F]:
        """Decorator: register `fn` under `name` with its parameter model (default: the base)."""

        def decorate(fn: F) -> F:
            entry = Entry(name, fn, params or self.base_params, options)
            if params is not None and not issubclass(params, self.base_params):
                raise TypeError(f"{self.kind} {name!r}: params must subclass {self.base_params}")
            self._entries[name] = entry
            setattr(fn, ENTRY_ATTR, entry)
            return fn

        return decorate

    def names(self) -> list[str]:
        """Built-in names (sorted)."""
        return sorted(self._entries)

    def get(self, name: str) -> Entry[F]:
        """The entry for a built-in name, an entry point, or `module:function`; else ValueError."""
        if name in self._entries:
            return self._entries[name]
        found = entry_points(group=self.group, name=name)
        if found:
            return self._from_callable(name, next(iter(found)).load())
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ValueError(
                    f"{self.kind} {name!r}: cannot import {module_name}: {exc}"
                ) from exc
            fn = getattr(module, attr, None)
            if fn is None:
                raise ValueError(f"{self.kind} {name!r}: {module_name} has no attribute {attr!r}")
            return self._from_callable(name, fn)
        raise ValueError(
            f"unknown {self.kind} {name!r}; expected one of {self.names()}, an installed "
            f"'{self.group}' entry point, or '{self.form}'"
        )

    def get_class(self, name: str, methods: tuple[str, ...], protocol: str) -> Any:
        """The class `name` names (as `get`), checked to have every one of `methods`;
        ValueError naming what it lacks otherwise (`protocol`: the dotted name to cite)."""
        cls = self.get(name).fn
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        if not isinstance(cls, type) or missing:
            raise ValueError(
                f"{self.kind} {name!r} is not a {protocol.rsplit('.', 1)[-1]} class ({protocol}): "
                f"it lacks {', '.join(missing) or 'a class'}"
            )
        return cls

    def _from_callable(self, name: str, fn: Any) -> Entry[F]:
        if not callable(fn):
            raise ValueError(f"{self.kind} {name!r} is not callable")
        entry = getattr(fn, ENTRY_ATTR, None)
        # `is fn`: a subclass of a registered class inherits the attribute but is not that entry
        if isinstance(entry, Entry) and entry.fn is fn:
            return Entry(name, entry.fn, entry.params, entry.options)
        return Entry(name, fn, self.base_params)
