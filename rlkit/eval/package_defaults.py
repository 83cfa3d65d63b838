"""Eval defaults an environment package declares in its pyproject.toml.

    [tool.rlkit.eval]
    num_examples = 5
    rollouts_per_example = 3

    [tool.rlkit.eval.sampling]
    temperature = 0.7
    max_tokens = 32

Top-level keys fill EvalConfig fields the user did not set; `sampling` sits just above the
environment's own sampling defaults (so -t/-T/-S still win). The file is found next to the
environment's module, which covers local environment folders, editable installs and sdists; a
wheel carries no pyproject.toml, so an environment installed from one uses rlkit's defaults.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from rlkit.config import validate
from rlkit.envs.loader import module_names
from rlkit.errors import UsageError
from rlkit.eval.config import EvalConfig
from rlkit.hub.names import parse_env_id

ALLOWED_KEYS = {
    "num_examples",
    "rollouts_per_example",
    "max_concurrent",
    "max_tokens",
    "temperature",
    "sampling",
}


def _find_pyproject(env_id: str) -> Path | None:
    """The pyproject.toml of the project that provides the environment's module, if at hand."""
    name = parse_env_id(env_id, require_owner=False).name
    for module_name in module_names(name):
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            continue
        for folder in list(Path(spec.origin).parents)[:3]:
            path = folder / "pyproject.toml"
            if path.is_file():
                project = tomllib.loads(path.read_text()).get("project", {})
                wanted = {canonicalize_name(name), canonicalize_name(module_name)}
                return path if canonicalize_name(project.get("name", "")) in wanted else None
    return None


def package_eval_defaults(env_id: str) -> tuple[dict[str, Any], Path | None]:
    """(`[tool.rlkit.eval]` table, the file it came from); empty when there is none."""
    path = _find_pyproject(env_id)
    if path is None:
        return {}, None
    try:
        table = tomllib.loads(path.read_text()).get("tool", {}).get("rlkit", {}).get("eval", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from exc
    unknown = sorted(set(table) - ALLOWED_KEYS)
    if unknown:
        raise UsageError(
            f"{path}: [tool.rlkit.eval] has unknown keys {unknown}; allowed: {sorted(ALLOWED_KEYS)}"
        )
    return table, path


def apply_package_defaults(
    config: EvalConfig, defaults: dict[str, Any], source: Path | None
) -> tuple[EvalConfig, dict[str, Any]]:
    """(config with unset fields filled from `defaults`, the package's sampling defaults)."""
    fields = {
        key: value
        for key, value in defaults.items()
        if key != "sampling" and key not in config.model_fields_set
    }
    data = {**config.model_dump(exclude_unset=True), **fields}
    updated = validate(EvalConfig, data, source=f"{source} [tool.rlkit.eval]")
    return updated, dict(defaults.get("sampling") or {})
