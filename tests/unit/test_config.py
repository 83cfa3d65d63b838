"""Config loading: TOML, dotted overrides, errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from rlkit.config import Config, dump_toml, load_config, parse_overrides
from rlkit.errors import UsageError


class Optim(Config):
    lr: float = Field(1e-3, description="learning rate")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.99], description="Adam betas")


class Env(Config):
    id: str = Field("reverse-text", description="environment id")
    weight: float = Field(1.0, gt=0, description="sampling weight")


class Root(Config):
    name: str = Field("run", description="run name")
    optim: Optim = Field(default_factory=Optim, description="optimizer")
    env: list[Env] = Field(default_factory=list, description="environments")


def test_toml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name = "a"\n[optim]\nlr = 0.1\n[[env]]\nid = "math"\n')
    cfg = load_config(Root, path, ["--optim.lr", "1e-5", "--env.0.weight=2", "--name=b"])
    assert cfg.name == "b"
    assert cfg.optim.lr == 1e-5
    assert cfg.env[0].id == "math" and cfg.env[0].weight == 2.0
    assert 'name = "b"' in dump_toml(cfg)


def test_override_values_parse_as_toml_literals() -> None:
    assert parse_overrides(["--a=[1, 2]", "--b", "true", "--c=hello"]) == [
        ("a", [1, 2]),
        ("b", True),
        ("c", "hello"),
    ]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["--optim.lrr=1"], "optim.lrr"),
        (["--env.0.weight", "-1"], "env.0.weight"),
        (["--optim.lr", "fast"], "optim.lr"),
    ],
)
def test_bad_fields_are_named(overrides: list[str], needle: str) -> None:
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        load_config(Root, None, overrides)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        load_config(Root, tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(UsageError, match="invalid TOML"):
        load_config(Root, bad)
    with pytest.raises(UsageError, match="--section.field"):
        load_config(Root, None, ["dangling"])


def test_overrides_need_their_dashes() -> None:
    assert parse_overrides(["--optim.lr=0.5"]) == [("optim.lr", 0.5)]
    with pytest.raises(UsageError, match="'optim.lr=0.5' must look like --section.field VALUE"):
        parse_overrides(["optim.lr=0.5"])
