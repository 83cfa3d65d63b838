"""Configuration: pydantic models loaded from TOML with dotted command-line overrides.

Every config model derives from `Config`, which forbids unknown fields so a typo is an error
that names the field. `load_config(Model, path, overrides)` reads TOML, applies overrides such
as ``["--trainer.lr", "1e-5", "--env.0.weight=2"]`` (values parsed as TOML literals, falling back
to plain strings) and validates; any problem raises `UsageError` naming the field.

Every command that takes a config (`rlkit train`, `rlkit sft`, `python -m rlkit.trainer.main`)
accepts the same overrides after the config path: `--section.field VALUE` or
`--section.field=VALUE`.
"""

from __future__ import annotations

import tomllib
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


def apply_override(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `data[a][b][c] = value` for `dotted == "a.b.c"`; integer parts index lists."""
    parts = dotted.split(".")
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
        out.append((key.replace("-", "_"), parse_value(raw)))
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


def validate(model: type[C], data: dict[str, Any], source: str = "config") -> C:
    """Validate `data` into `model`, turning pydantic errors into a UsageError naming fields."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "<root>"
            lines.append(f"  {loc}: {err['msg']}")
        raise UsageError(f"invalid {source}:\n" + "\n".join(lines)) from exc


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
