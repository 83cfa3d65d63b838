"""The code of another commit, for benchmarks that run old and new code side by side."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def extract(ref: str, into: Path) -> Path:
    """The tree of `ref` (committed files only) under `into`."""
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
