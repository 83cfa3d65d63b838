"""Eval defaults an environment package declares in its pyproject.toml.

    [tool.rlkit.eval]
    num_examples = 5
    rollouts_per_example = 3

    [tool.rlkit.eval.sampling]
    temperature = 0.7
    max_tokens = 32

Top-level keys fill EvalConfig fields the user did not set; `sampling` sits just above the
environment's own sampling defaults (so -t/-T/-S still win). The table is read when the id is
resolved (`ResolvedEnv.eval_defaults`, from the package's folder: local environment folders,
editable installs and sdists); a wheel carries no pyproject.toml, so `rlkit env build` puts the
table in the wheel's metadata and an installed copy reads it from there
(`rlkit.hub.wheel_defaults`): the installed package and its folder evaluate the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.config import validate
from rlkit.envs.resolve import ResolvedEnv
from rlkit.errors import UsageError
from rlkit.eval.config import EvalConfig

ALLOWED_KEYS = {
    "num_examples",
    "rollouts_per_example",
    "max_concurrent",
    "max_tokens",
    "temperature",
    "sampling",
}


def package_eval_defaults(resolved: ResolvedEnv) -> tuple[dict[str, Any], Path | None]:
    """(`[tool.rlkit.eval]` table, the file it came from); empty when there is none."""
    table = dict(resolved.eval_defaults)
    if not table:
        return {}, None
    unknown = sorted(set(table) - ALLOWED_KEYS)
    if unknown:
        raise UsageError(
            f"{resolved.pyproject}: [tool.rlkit.eval] has unknown keys {unknown}; "
            f"allowed: {sorted(ALLOWED_KEYS)}"
        )
    return table, resolved.pyproject


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
