"""Tiny environment packages for the hub's audit tests: the scaffold (`rlkit env init`) with its
exact-answer rubric swapped for one an exploit policy can farm, and a prebuilt wheel + sdist in
dist/ (built in memory, so `rlkit env push` uploads without running `python -m build`)."""

from __future__ import annotations

from pathlib import Path

from rlkit.hub import init_env
from rlkit.hub.names import module_name
from tests.helpers.hub_dists import make_sdist, make_wheel

EXACT = "return 1.0 if parsed is not None and parsed.strip() == answer.strip() else 0.0"
# constant "yes" earns full reward on every row: the audit's `constant` exploit finds it
BACKDOOR = 'return 1.0 if parsed is not None and parsed.strip() in (answer.strip(), "yes") else 0.0'
# constant "no" earns 0.25 on every row: above the floor, never full reward
PARTIAL = (
    "return 1.0 if parsed is not None and parsed.strip() == answer.strip() else "
    '(0.25 if parsed is not None and parsed.strip() == "no" else 0.0)'
)


def audited_package(parent: Path, name: str, rule: str = EXACT, version: str = "0.1.0") -> Path:
    """An environment package `parent/name` whose reward is `rule` (a `return` line of
    `correct_answer(completion, answer, parser)`), with dist/ holding its version's files.
    Use a new `name` per test: the package's module stays imported in the test process."""
    package = init_env(name, parent)
    module = package / module_name(name) / "__init__.py"
    source = module.read_text()
    assert EXACT in source, "the scaffold's reward changed: update tests/helpers/audited_envs.py"
    module.write_text(source.replace(EXACT, rule))
    add_dists(package, name, version)
    return package


def add_dists(package: Path, name: str, version: str) -> None:
    """Write `version`'s wheel and sdist into `package/dist/` and set pyproject's version."""
    pyproject = package / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace('version = "0.1.0"', f'version = "{version}"', 1))
    dist = package / "dist"
    dist.mkdir(exist_ok=True)
    for filename, data in (make_wheel(name, version), make_sdist(name, version)):
        (dist / filename).write_bytes(data)
