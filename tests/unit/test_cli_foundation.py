"""`rlkit model` and `rlkit infer` argument checking: clear errors and exit code 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def rlkit(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from rlkit_cli.main import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # three CLI processes building models
def test_init_tiny_cli(tmp_path: Path) -> None:
    out = tmp_path / "m"
    done = rlkit("model", "init-tiny", "--out", str(out), "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert (out / "config.json").is_file() and "parameters" in done.stdout
    again = rlkit("model", "init-tiny", "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr
    bad = rlkit("model", "init-tiny", "--out", str(tmp_path / "x"), "--arch", "gpt2")
    assert bad.returncode == 2 and "qwen3" in bad.stderr


@pytest.mark.slow  # three CLI processes (torch imports), ~6 s
def test_infer_rejects_bad_model_dirs(tmp_path: Path) -> None:
    missing = rlkit("infer", "--model", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "not found" in missing.stderr
    (tmp_path / "noconfig").mkdir()
    noconfig = rlkit("infer", "--model", str(tmp_path / "noconfig"))
    assert noconfig.returncode == 2 and "config.json" in noconfig.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"")
    bad_json = rlkit("infer", "--model", str(broken))
    assert bad_json.returncode == 2 and "not valid JSON" in bad_json.stderr


def test_infer_rejects_busy_port(tiny_model_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = rlkit("infer", "--model", str(tiny_model_dir), "--port", str(port))
    assert done.returncode == 2 and "already in use" in done.stderr
