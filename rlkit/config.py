"""Configuration: pydantic models loaded from TOML with dotted command-line overrides.

Every config model derives from `Config`, which forbids unknown fields so a typo is an error
that names the field. `load_config(Model, path, overrides)` reads TOML, applies overrides such
as ``["--trainer.lr", "1e-5", "--env.0.weight=2"]`` (values parsed as TOML literals, falling back
to plain strings; a part of the key in double quotes is taken whole, as in a TOML key:
``--orchestrator.schedulers."my_pkg.mod:MyScheduler".record=b``) and validates; any problem
raises `UsageError` naming the field, and an unknown field with a close known one says "did
you mean" (`did_you_mean`, the one spelling helper every command's config errors go through).

Every command that takes a config (`rlkit train`, `rlkit sft`, `python -m rlkit.trainer.main`)
accepts the same overrides after the config path: `--section.field VALUE` or
`--section.field=VALUE`.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rlkit.errors import UsageError

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base for all rlkit configs: unknown fields are errors, defaults are documented."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def parse_value(text: str) -> Any:
    """Parse an override value as a TOML literal (`1e-5`, `true`, `[1, 2]`), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


KEY_PART = re.compile(r'"([^"]*)"|([^."]+)')


def key_parts(dotted: str) -> list[str]:
    """``a."b.c".d`` -> ``["a", "b.c", "d"]``: a quoted part is one key, dots and all."""
    return [quoted or bare for quoted, bare in KEY_PART.findall(dotted)]


def apply_override(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `data[a][b][c] = value` for `dotted == "a.b.c"`; integer parts index lists."""
    parts = key_parts(dotted)
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt_is_index = parts[i + 1].isdigit()
        if isinstance(node, list):
            idx = int(part)
            while len(node) <= idx:
                node.append({})
            node = node[idx]
        else:
            node = node.setdefault(part, [] if nxt_is_index else {})
    last = parts[-1]
    if isinstance(node, list):
        idx = int(last)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    else:
        node[last] = value


def parse_overrides(args: list[str]) -> list[tuple[str, Any]]:
    """Turn ``["--a.b", "1", "--c=x"]`` into ``[("a.b", 1), ("c", "x")]`` (see the module doc)."""
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise UsageError(f"override {arg!r} must look like --section.field VALUE")
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
        elif i + 1 < len(args):
            i += 1
            raw = args[i]
        else:
            raise UsageError(f"override {arg!r} must look like --section.field VALUE")
        # dashes spell underscores in field names, not inside a quoted key
        key = "".join(
            p if p.startswith('"') else p.replace("-", "_") for p in re.split(r'("[^"]*")', key)
        )
        out.append((key, parse_value(raw)))
        i += 1
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from exc


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean X?' for the known names closest to a misspelt `name`, else ''."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def validate(model: type[C], data: dict[str, Any], source: str = "config") -> C:
    """Validate `data` into `model`, turning pydantic errors into a UsageError naming fields;
    an unknown field says which known field of its section it is closest to."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {loc}: {msg}" for loc, msg in field_errors(model, exc)]
        raise UsageError(f"invalid {source}:\n" + "\n".join(lines)) from exc


def field_errors(model: type[BaseModel], exc: ValidationError) -> list[tuple[str, str]]:
    """(dotted field, problem) for each error of validating `model`; an unknown field names the
    closest known one."""
    errors = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field{_suggest(model, err['loc'])}"
        errors.append((loc, msg))
    return errors


def _suggest(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """A close field of the unknown field's own section, else a close field anywhere in
    `model` by its full dotted path (`trainer.lrr` -> `trainer.optim.lr`)."""
    name = str(loc[-1])
    section = _model_at(model, loc[:-1])
    hint = did_you_mean(name, section.model_fields if section else ())
    if hint:
        return hint
    paths = _field_paths(model)
    close = difflib.get_close_matches(name, [p.rsplit(".", 1)[-1] for p in paths], cutoff=0.7)
    matches = [p for p in paths if p.rsplit(".", 1)[-1] in close]
    return f"; did you mean {' or '.join(matches[:3])}?" if matches else ""


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field of `model` and of the config sections inside it, as dotted paths."""
    paths = []
    for name, field in model.model_fields.items():
        paths.append(prefix + name)
        inner = _model_in(field.annotation)
        if inner is not None and inner is not model:
            paths += _field_paths(inner, f"{prefix}{name}.")
    return paths


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config model that the section at `loc` (field names and list indices) validates as."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(str(part))
        current = _model_in(field.annotation) if field else None
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside an annotation like `X`, `X | None`, `list[X]`, `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_config(
    model: type[C], path: str | Path | None = None, overrides: list[str] | None = None
) -> C:
    """Load `model` from an optional TOML file plus dotted CLI overrides."""
    data: dict[str, Any] = read_toml(path) if path else {}
    for key, value in parse_overrides(overrides or []):
        apply_override(data, key, value)
    return validate(model, data, source=str(path) if path else "config")


def dump_toml(config: BaseModel, exclude: dict[str, Any] | None = None) -> str:
    """Render a resolved config as TOML (used by --dry-run and saved next to runs)."""
    import tomli_w

    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True, exclude=exclude))
