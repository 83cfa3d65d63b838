"""Refusals before anything starts (issue 66 item 3), as a user meets them: `rlkit train` of a
model whose tokenizer has no chat template, and `rlkit eval` / `rlkit train` of an environment
that asks the sandbox service for more than it allows, exit 2 naming the fix, before any server
starts, and leave no run directory behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import DEMO_CONFIG, RLKIT
from tests.helpers.fake_openai import FakeOpenAIServer
from tests.helpers.sandbox_service import sandbox_service

pytestmark = pytest.mark.slow  # a CLI subprocess that loads the environments


def test_a_model_without_a_chat_template_is_refused_up_front(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "base-model"
    subprocess.run(["cp", "-r", str(tiny_model_dir), str(model)], check=True)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))

    run_dir = tmp_path / "run"
    done = subprocess.run(
        [RLKIT, "train", str(DEMO_CONFIG), f"--model.path={model}", f"--log.run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "has no chat template" in out and "chat_template.jinja" in out
    assert "vllm" not in out.lower() and not run_dir.exists()


@pytest.mark.system  # bubblewrap: the sandbox service
def test_an_environment_asking_more_than_the_sandbox_service_allows_is_refused_up_front(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The code environment runs a problem's tests in one sandbox request (6 tests x 5.5 s + 5 s
    = 38 s on the shipped problems); a service started with `--profile 30:512` would refuse each
    such request at its reward call. Checked once, before the eval's run directory or the
    training run's servers exist; asking less (`timeout` 2 s: 20 s) passes the check."""
    with sandbox_service(tmp_path, "--profile", "30:512", "--pool-size", "0") as service:
        env = {
            **os.environ,
            "RLKIT_SANDBOX_URL": service.url,
            "RLKIT_SANDBOX_TOKEN_FILE": str(service.token_file),
        }
        runs = tmp_path / "runs"
        with FakeOpenAIServer() as fake:
            base = [RLKIT, "eval", "code", "-m", "fake-model", "--base-url", fake.url]
            base += ["-n", "2", "-r", "1", "-o", str(runs)]
            refused = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
            out = refused.stdout + refused.stderr
            assert refused.returncode == 2, out
            assert "allows at most 30 s and 512 MiB" in out and "code asks timeout 38 s" in out
            assert "rlkit sandbox serve --profile 38:512" in out and "--env-args" in out
            assert not runs.exists()

            asks_less = subprocess.run(
                [*base, "--env-args", '{"timeout": 2.0}', "--allow-errors"],
                capture_output=True, text=True, env=env, timeout=300,
            )  # fmt: skip
            out = asks_less.stdout + asks_less.stderr
            assert asks_less.returncode == 0 and "allows at most" not in out, out
            assert runs.is_dir()

        run_dir = tmp_path / "train-run"
        train = subprocess.run(
            [RLKIT, "train", str(DEMO_CONFIG), "--env.0.id=code", "--env.0.args={}",
             f"--model.path={tiny_model_dir}", f"--log.run_dir={run_dir}"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        out = train.stdout + train.stderr
        assert train.returncode == 2 and "rlkit sandbox serve --profile 38:512" in out, out
        assert "vllm" not in out.lower() and not run_dir.exists()
