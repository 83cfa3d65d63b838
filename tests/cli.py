"""Run the `rlkit` console entry point in-process from tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rlkit_cli.main import main


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str
) -> tuple[int | str | None, str]:
    """Run `rlkit ARGS` in-process; returns (exit code, stdout + stderr)."""
    monkeypatch.setattr(sys, "argv", ["rlkit", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def only_run_dir(output_dir: Path) -> Path:
    """The single run directory an eval wrote under `output_dir`."""
    (run_dir,) = list(output_dir.iterdir())
    return run_dir
