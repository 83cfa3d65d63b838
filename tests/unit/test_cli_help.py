"""Help that renders every word (issue 66 item 6): no command's help is read as Rich markup, so
`[section]` names and `[default]` notes survive (`Sandbox backend [bwrap].`, `Render a SLURM job
for [slurm] ...`), and `rlkit eval run`'s usage line shows its ENV_ID."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
import typer
from rlkit_cli.main import NEWCOMER_ORDER, app

from tests.helpers.cli import run_cli

CLI = [sys.executable, "-c", "from rlkit_cli.main import main; main()"]


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


def rlkit_help(*args: str, flat: bool = True) -> str:
    done = subprocess.run([*CLI, *args, "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split()) if flat else done.stdout


def test_commands_are_listed_in_a_newcomers_order() -> None:
    """`rlkit --help`: environment, eval, train, the run's report first; then the operator's
    commands; and a first session spelled out."""
    out = rlkit_help(flat=False)
    listed = re.findall(r"^  ([a-z]+)  ", out.split("Commands:")[1], re.M)
    assert listed[:4] == ["env", "eval", "train", "runs"], listed
    assert listed == [*NEWCOMER_ORDER, "sandbox"]
    first = out.split("A first session:")[1]
    assert first.index("env init") < first.index("eval ./my-env -m MODEL") < first.index("train")


def test_dash_m_means_the_model_in_every_command() -> None:
    """`-m` is the model by the name a server serves it under everywhere: `infer -m X` serves X,
    `eval -m X` asks for X, `env check -m X` reads X's tokenizer."""
    for command in (["infer"], ["eval", "run"], ["env", "check"]):
        out = rlkit_help(*command)
        assert re.search(r"-m, --model \S+ The model: ", out), (command, out)
    assert "It is served under that name, so `rlkit eval ENV -m` takes the same value" in (
        rlkit_help("infer")
    )
    assert "(`rlkit infer -m X` serves X" in rlkit_help("eval", "run")
