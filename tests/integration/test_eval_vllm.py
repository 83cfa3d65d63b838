"""`rlkit eval` against the real vLLM CPU server (shared session fixture) with a tiny model."""

from __future__ import annotations

import sys

import pytest
from rlkit_cli.main import main

from tests.helpers.eval_results import check_engine_results


def eval_cli(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["rlkit", "eval", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, out + err
    return out


@pytest.mark.slow
def test_reverse_text_and_math_on_vllm(vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys):
    base = ["-m", str(tiny_model_dir), "-b", f"{vllm_server.url}/v1", "-t", "16", "-T", "1.0"]
    base += ["--token-file", str(vllm_server.token_file)]
    out = eval_cli(
        monkeypatch, capsys, "reverse-text", *base, "-n", "3", "-r", "2", "-o", str(tmp_path / "rt")
    )
    assert "pass@2" in out
    check_engine_results(tmp_path / "rt", n=3, r=2)

    eval_cli(monkeypatch, capsys, "math", *base, "-n", "2", "-r", "2", "-o", str(tmp_path / "m"))
    lines = check_engine_results(tmp_path / "m", n=2, r=2)
    assert all("boxed_answer" in rec["metrics"] for rec in lines)
