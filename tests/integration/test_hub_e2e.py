"""End to end through the `rlkit` CLI: a real `rlkit hub serve` on 127.0.0.1, and the local
directory hub with no server; environments are installed into a fresh virtualenv and
evaluated there against the fake OpenAI-compatible server.
(See `tests.helpers.hub_http.fresh_venv` for how the fresh virtualenv shares this one's packages.)
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.hub_http import CLI, fresh_venv, installed, run

pytestmark = pytest.mark.venv


def add_numbers(body: dict[str, Any]) -> str:
    """Responder that solves the scaffold's 'What is A + B?' tasks."""
    question = body["messages"][-1]["content"]
    a, b = map(int, re.findall(r"\d+", question)[:2])
    return str(a + b)


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fresh_venv(tmp_path_factory.mktemp("fresh"))


@pytest.fixture
def hub_server(tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """`rlkit hub serve` in its own process group; yields (url, data dir, alice's token)."""
    data = tmp_path / "hubdata"
    token = run(["hub", "token", "create", "--data", str(data), "--owner", "alice"]).stdout.strip()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, *CLI, "hub", "serve", "--data", str(data), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/api/v1/envs").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "hub did not start"
            time.sleep(0.2)
        yield url, data, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def set_version(package: Path, version: str) -> None:
    pyproject = package / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('version = "0.1.0"', f'version = "{version}"')
    )


@pytest.mark.slow
def test_server_end_to_end(hub_server: tuple[str, Path, str], fresh_python: str, tmp_path: Path):
    url, data, token = hub_server
    auth = {"RLKIT_HUB_TOKEN": token}
    run(["env", "init", "adder-env", "-p", str(tmp_path)])
    package = tmp_path / "adder-env"
    run(["env", "build", str(package), "--no-isolation"])
    pushed = run(["env", "push", str(package), "--hub", url], env=auth)
    assert "published alice/adder-env@0.1.0" in pushed.stdout
    refused = run(["env", "push", str(package), "--hub", url], env=auth, expect=2)
    assert "already published" in refused.stderr
    run(["env", "push", str(package), "--hub", url], expect=2)  # no token at all

    run(["env", "install", "alice/adder-env@0.1.0", "--hub", url], python=fresh_python)
    assert installed(fresh_python, "adder-env") == "0.1.0"
    assert installed(sys.executable, "adder-env") is None  # the project venv is untouched

    with FakeOpenAIServer(responder=add_numbers) as fake:
        run(
            [
                "eval",
                "alice/adder-env",
                "-m",
                "fake-model",
                "--base-url",
                fake.url,
                "-n",
                "4",
                "-r",
                "2",
                "--output-dir",
                str(tmp_path / "runs"),
                "--push",
                "--hub",
                url,
            ],
            python=fresh_python,
            env=auth,
        )
    card = httpx.get(f"{url}/api/v1/envs/alice/adder-env").json()
    (result,) = card["evals"]
    assert result["model"] == "fake-model" and result["version"] == "0.1.0"
    assert result["mean_reward"] == 1.0 and result["n"] == 8 and result["pass_at_k"]["pass@2"] == 1
    page = httpx.get(f"{url}/envs/alice/adder-env").text
    assert "fake-model" in page and "1.000" in page

    set_version(package, "0.2.0")
    run(["env", "build", str(package), "--no-isolation"])
    run(["env", "push", str(package), "--hub", url], env=auth)
    listing = run(["env", "search", "adder", "--tag", "arithmetic", "--hub", url]).stdout
    assert "alice/adder-env" in listing and "0.2.0" in listing
    info = run(["env", "info", "alice/adder-env", "--json", "--hub", url]).stdout
    assert '"latest_version": "0.2.0"' in info

    plain_pip = subprocess.run(  # the hub is a standard index: plain pip resolves from it
        [
            fresh_python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--index-url",
            f"{url}/simple/",
            "adder-env",
            "-d",
            str(tmp_path / "dl"),
        ],
        capture_output=True,
        text=True,
    )
    assert plain_pip.returncode == 0, plain_pip.stderr
    assert (tmp_path / "dl" / "adder_env-0.2.0-py3-none-any.whl").is_file()

    wheel = data / "files" / "adder-env" / "adder_env-0.2.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    refused = run(
        ["env", "install", "alice/adder-env@0.2.0", "--hub", url], python=fresh_python, expect=2
    )
    assert "sha256 mismatch" in refused.stderr
    plain_pip = subprocess.run(
        [
            fresh_python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--index-url",
            f"{url}/simple/",
            "adder-env==0.2.0",
        ],
        capture_output=True,
        text=True,
    )
    assert plain_pip.returncode != 0 and "HASHES" in plain_pip.stderr.upper()
    assert installed(fresh_python, "adder-env") == "0.1.0"

    pulled = run(
        ["env", "pull", "alice/adder-env@0.1.0", "-d", str(tmp_path / "src"), "--hub", url]
    )
    assert "adder_env-0.1.0" in pulled.stdout
    assert (tmp_path / "src" / "adder_env-0.1.0" / "adder_env" / "train.jsonl").is_file()


@pytest.mark.slow
def test_local_hub_without_server(fresh_python: str, tmp_path: Path) -> None:
    env = {"RLKIT_HOME": str(tmp_path / "home"), "RLKIT_HUB_OWNER": "carol", "RLKIT_HUB": ""}
    run(["env", "init", "local-adder", "-p", str(tmp_path)])
    package = tmp_path / "local-adder"
    run(["env", "build", str(package), "--no-isolation"])
    assert "carol/local-adder@0.1.0" in run(["env", "push", str(package)], env=env).stdout
    assert "carol/local-adder" in run(["env", "list"], env=env).stdout
    assert (tmp_path / "home" / "hub" / "simple" / "local-adder" / "index.html").is_file()
    # `rlkit eval OWNER/NAME` installs the environment on demand from the local hub
    with FakeOpenAIServer(responder=add_numbers) as fake:
        out = run(
            [
                "eval",
                "carol/local-adder",
                "-m",
                "fake-model",
                "--base-url",
                fake.url,
                "-n",
                "2",
                "-r",
                "1",
                "--output-dir",
                str(tmp_path / "runs"),
                "--push",
            ],
            python=fresh_python,
            env=env,
        ).stdout
    assert installed(fresh_python, "local-adder") == "0.1.0"
    assert "pushed:" in out
    info = run(["env", "info", "carol/local-adder", "--json"], env=env).stdout
    assert '"model": "fake-model"' in info and '"mean_reward": 1.0' in info
