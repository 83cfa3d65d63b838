"""`rlkit eval` flag validation: bad input exits with code 2 and a message naming the flag."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-a", "{not json"], "-a/--env-args is not valid JSON"),
        (["-S", "[1, 2]"], "-S/--sampling-args must be a JSON object"),
        (["-S", "{'temperature': 1}"], "-S/--sampling-args is not valid JSON"),
        (["-n", "0"], "--num-examples"),
        (["-r", "0"], "--rollouts-per-example"),
        (["-c", "0"], "--max-concurrent"),
    ],
)
def test_bad_flags_exit_2(monkeypatch, capsys, args: list[str], message: str) -> None:
    code, output = run_cli(monkeypatch, capsys, "eval", "reverse-text", "-m", "m", *args)
    assert code == 2
    assert message in " ".join(output.split())


def test_missing_env_id_and_missing_run_dir_exit_2(monkeypatch, capsys, tmp_path) -> None:
    code, output = run_cli(monkeypatch, capsys, "eval", "-m", "m")
    assert code == 2 and "missing ENV_ID" in output
    code, output = run_cli(monkeypatch, capsys, "eval", "--resume", str(tmp_path))
    assert code == 2 and "not an eval run directory" in output
    code, output = run_cli(monkeypatch, capsys, "eval", "show", str(tmp_path))
    assert code == 2 and "not an eval run directory" in output


def test_help_lists_run_and_show(monkeypatch, capsys) -> None:
    code, output = run_cli(monkeypatch, capsys, "eval", "--help")
    assert code == 0 and "show" in output and "run" in output


def test_unknown_dotted_override_exits_2_naming_it(monkeypatch, capsys, tmp_path) -> None:
    code, output = run_cli(
        monkeypatch, capsys, "eval", "reverse-text", "-m", "m", "--sandbx.backend", "local"
    )
    assert code == 2 and "sandbx" in output
    code, output = run_cli(monkeypatch, capsys, "eval", "--config", str(tmp_path / "no.toml"))
    assert code == 2 and "config file not found" in output


def test_dry_run_prints_resolved_config(monkeypatch, capsys, tmp_path) -> None:
    config = tmp_path / "eval.toml"
    config.write_text('env_id = "reverse-text"\nmodel = "m"\nnum_examples = 7\n')
    args = ["--config", str(config), "-r", "2", "--sandbox.backend", "local", "--dry-run"]
    code, output = run_cli(monkeypatch, capsys, "eval", *args)
    assert code == 0, output
    assert 'env_id = "reverse-text"' in output and "num_examples = 7" in output
    assert "rollouts_per_example = 2" in output and 'backend = "local"' in output


def test_an_unknown_env_args_key_says_did_you_mean(monkeypatch, capsys) -> None:
    """Issue 66: not `load_environment() got an unexpected keyword argument 'min_length'`."""
    code, output = run_cli(
        monkeypatch, capsys, "eval", "reverse-text", "-m", "m", "-a", '{"min_length": 3}'
    )
    flat = " ".join(output.split())
    assert code == 2 and "takes no argument 'min_length': did you mean min_len" in flat, output
