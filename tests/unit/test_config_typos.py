"""A misspelt field is refused by every command that takes a config, naming the field and the
closest known one (issue 45: `rlkit eval --sampling.max_token 10` used to exit 0 and store
`max_token` in the run's metadata)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.envs.sampling import SERVER_SAMPLING_ARGS
from tests.helpers.cli import ROOT, run_cli

TRAIN = str(ROOT / "examples/tiny-cpu/train.toml")
SFT = str(ROOT / "examples/tiny-cpu/sft.toml")


@pytest.mark.parametrize(
    ("args", "named", "suggested"),
    [
        (
            ["eval", "reverse-text", "-m", "m", "--sampling.max_token", "10"],
            "max_token",
            "max_tokens",
        ),
        (["eval", "reverse-text", "-m", "m", "-S", '{"top_pp": 0.9}'], "top_pp", "top_p"),
        (
            ["eval", "reverse-text", "-m", "m", "--num-exampels", "3"],
            "num_exampels",
            "num_examples",
        ),
        (["train", TRAIN, "--orchestrator.group_sise", "4"], "group_sise", "group_size"),
        (["train", TRAIN, "--orchestrator.sampling.temprature", "1"], "temprature", "temperature"),
        (["train", TRAIN, "--trainer.lrr", "1e-5"], "trainer.lrr", "trainer.optim.lr"),
        (["sft", SFT, "--optim.lrr", "1e-5"], "optim.lrr", "lr"),
        (["simulate", TRAIN, "--simulate.at_capp", "0.1"], "at_capp", "at_cap"),
    ],
)
def test_a_typo_exits_2_naming_the_field_and_the_closest_one(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    args: list[str],
    named: str,
    suggested: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    dry_run = [] if args[0] == "simulate" else ["--dry-run"]  # simulate validates first anyway
    code, out = run_cli(monkeypatch, capsys, *args, *dry_run)
    assert code == 2, out
    assert named in out
    assert f"did you mean {suggested}" in out
    assert not list(tmp_path.iterdir())  # nothing written: no run folder, no metadata


def test_a_field_nothing_resembles_is_refused_without_a_guess(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, out = run_cli(monkeypatch, capsys, "train", TRAIN, "--zzzz.qqqq", "1", "--dry-run")
    assert code == 2
    assert "zzzz: unknown field" in out and "did you mean" not in out


def test_known_server_sampling_arguments_still_pass(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, out = run_cli(
        monkeypatch, capsys, "eval", "reverse-text", "-m", "m", "--sampling.top_p", "0.9",
        "--sampling.seed", "3", "--dry-run",
    )  # fmt: skip
    assert code is None or code == 0, out
    assert "top_p = 0.9" in out and "seed = 3" in out


def test_server_sampling_arguments_are_ones_vllm_accepts() -> None:
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    assert SERVER_SAMPLING_ARGS <= set(protocol.ChatCompletionRequest.model_fields)
