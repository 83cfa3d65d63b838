"""One set of CLI conventions: overrides, --resume, process counts, enum choices, ports."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import typer
from rlkit_cli.main import app

from rlkit.ports import HUB_PORT, INFERENCE_PORT, SANDBOX_PORT
from rlkit.trainer.main import trainer_command
from tests.helpers.cli import ROOT, run_cli

SFT = str(ROOT / "examples/tiny-cpu/sft.toml")


def _default(path: list[str], option: str) -> object:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return next(p.default for p in command.params if p.name == option)


def test_no_two_servers_default_to_the_same_port() -> None:
    assert _default(["infer"], "port") == INFERENCE_PORT
    assert _default(["hub", "serve"], "port") == HUB_PORT
    assert _default(["sandbox", "serve"], "port") == SANDBOX_PORT
    assert len({INFERENCE_PORT, HUB_PORT, SANDBOX_PORT}) == 3


def test_sft_takes_the_same_overrides_and_process_count_as_train(monkeypatch, capsys) -> None:
    code, out = run_cli(monkeypatch, capsys, "sft", SFT, "--dry-run", "--nproc", "2")
    assert code in (0, None), out
    code, out = run_cli(
        monkeypatch, capsys, "sft", SFT, "--dry-run", "--optim.lr", "0.5", "--data.epochs=3"
    )
    resolved = tomllib.loads(out)
    assert resolved["optim"]["lr"] == 0.5 and resolved["data"]["epochs"] == 3
    code, out = run_cli(monkeypatch, capsys, "sft", SFT, "--dry-run", "--nproc", "0")
    assert code == 2 and "nproc" in out


@pytest.mark.parametrize(
    "args",
    [
        ["train", "cfg.toml", "--role", "bogus"],
        ["model", "init-tiny", "--out", "x", "--size", "huge"],
        ["env", "check", "reverse-text", "--split", "test"],
        ["infer", "--model", "m", "--port", "70000"],
    ],
)
def test_choices_are_enums_and_bad_values_exit_2(monkeypatch, capsys, args: list[str]) -> None:
    code, out = run_cli(monkeypatch, capsys, *args)
    assert code == 2 and "Invalid value" in out


def test_one_trainer_command_builder_for_train_and_sft(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    rl = trainer_command(config, 1, resume=True)
    assert rl == [sys.executable, "-m", "rlkit.trainer.main", "--config", str(config)] + [
        "--mode",
        "rl",
        "--resume",
    ]
    sft = trainer_command(config, 4, mode="sft", resume="/c/step_1")
    assert sft[1:6] == ["-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone"]
    assert sft[-3:] == ["--mode", "sft", "--resume=/c/step_1"]
