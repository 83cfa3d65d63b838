"""Environment packages build without setuptools warnings (quiet `scripts/setup.sh`).

A warning here is a packaging mistake (a data folder missing from `packages`, a deprecated
license table) that setup would print on every install; fix the pyproject, do not hide it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ENVIRONMENTS = Path(__file__).resolve().parents[2] / "environments"
PACKAGES = sorted(p.name for p in ENVIRONMENTS.iterdir() if (p / "pyproject.toml").is_file())


@pytest.mark.venv  # pip wheel of each package
@pytest.mark.parametrize("name", PACKAGES)
def test_environment_package_builds_quietly(name: str, tmp_path: Path) -> None:
    source = shutil.copytree(ENVIRONMENTS / name, tmp_path / name)  # keep build/ out of the repo
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--disable-pip-version-check", str(source), "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in (result.stdout + result.stderr).lower(), result.stderr
    assert len(list((tmp_path / "dist").glob("*.whl"))) == 1
