"""Help that renders every word (issue 66 item 6): no command's help is read as Rich markup, so
`[section]` names and `[default]` notes survive (`Sandbox backend [bwrap].`, `Render a SLURM job
for [slurm] ...`), and `rlkit eval run`'s usage line shows its ENV_ID."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from rlkit_cli.main import app

from tests.helpers.cli import run_cli


def leaf_commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if hasattr(command, "commands"):  # a group (typer's own click)
        return [
            leaf
            for name, sub in command.commands.items()
            for leaf in leaf_commands(sub, (*path, name))
        ]
    return [path]


def test_every_bracketed_word_of_every_help_is_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    root = typer.main.get_command(app)
    paths = leaf_commands(root)
    assert len(paths) > 20
    for path in paths:
        command: Any = root
        for name in path:
            command = command.commands[name]
        code, out = run_cli(monkeypatch, capsys, *path, "--help")
        assert code in (0, None), out
        flat = " ".join(out.split())
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for word in {w for text in texts for w in re.findall(r"\[[^\]\s]+\]", text)}:
            assert word in flat, f"rlkit {' '.join(path)} --help lost {word}"


def test_usage_lines_show_their_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, out = run_cli(monkeypatch, capsys, "eval", "run", "--help")
    assert "eval run ENV_ID [OPTIONS]" in out
    code, out = run_cli(monkeypatch, capsys, "sandbox", "serve", "--help")
    assert "Sandbox backend [bwrap]." in " ".join(out.split())
    code, out = run_cli(monkeypatch, capsys, "train", "--help")
    assert "Render a SLURM job for [slurm] into" in " ".join(out.split())
