"""Fixtures shared by the integration tests."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

CUSTOM_ENV = '''
"""A custom environment: answer with the word reversed."""

from datasets import Dataset

from rlkit.envs import Parser, Rubric, SingleTurnEnv


def exact(completion, answer) -> float:
    return float(completion[-1]["content"].strip() == answer)


def length_ratio(completion, answer) -> float:
    return min(len(completion[-1]["content"]), len(answer)) / max(len(answer), 1)


def load_environment(num_words: int = 40, system_prompt: str | None = None) -> SingleTurnEnv:
    words = [f"word{i:03d}-abc" for i in range(num_words)]
    dataset = Dataset.from_list([{"question": w, "answer": w[::-1]} for w in words])
    return SingleTurnEnv(
        dataset=dataset,
        system_prompt=system_prompt,
        parser=Parser(),
        rubric=Rubric([exact, length_ratio], weights=[1.0, 0.0]),
        sampling_defaults={"max_tokens": 64},
    )
'''


@pytest.fixture
def custom_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ~30-line environment package in a temporary folder, found through RLKIT_ENV_PATH."""
    env_dir = tmp_path / "envs" / "word-flip"
    env_dir.mkdir(parents=True)
    (env_dir / "word_flip.py").write_text(textwrap.dedent(CUSTOM_ENV))
    (env_dir / "pyproject.toml").write_text('[project]\nname = "word-flip"\nversion = "0.1.0"\n')
    monkeypatch.setenv("RLKIT_ENV_PATH", str(tmp_path / "envs"))
    # the loader puts env folders on sys.path and imports once: make it find this test's copy
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "word_flip", raising=False)
    return "word-flip"


@pytest.fixture(scope="session", autouse=True)
def signal_env_on_path() -> Iterator[None]:
    """`tiny_train_cmd`'s environment (tests/integration/envs) is found by every integration
    test and the `rlkit` processes it starts, module-scoped fixtures' runs included."""
    from tests.helpers.cli import TEST_ENVS

    before = os.environ.get("RLKIT_ENV_PATH")
    os.environ["RLKIT_ENV_PATH"] = os.pathsep.join(p for p in (before, str(TEST_ENVS)) if p)
    yield
    if before is None:
        os.environ.pop("RLKIT_ENV_PATH", None)
    else:
        os.environ["RLKIT_ENV_PATH"] = before


@pytest.fixture(scope="session")
def lora_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One `rlkit infer --lora-rank 8 --max-loras 2` server (eager) on `tiny_model_dir`, shared
    by the LoRA tests that neither kill nor restart it: each unloads the adapters it loaded and
    serves the base weights again if it changed them. One LoRA engine start in a session. Its
    owner holds the tests' run token (what tests publish is signed with it); tenants `a` and `b`
    hold their own (`tenants/NAME.token` beside it); weights load from the tests' folders.
    What vLLM puts in the temporary folder goes to the server's own (its TMPDIR, where its
    `vllm_dist_*` file is), which the server removes when it stops."""
    from rlkit.inference import ServerProcess
    from rlkit.inference.temp_dirs import RPC_DIR_PREFIX
    from rlkit.ports import free_port
    from rlkit.protocol.credentials import TOKEN_FILE_ENV
    from tests.helpers.cli import RLKIT, TEST_SERVER_ARGS
    from tests.helpers.roles import process_environ
    from tests.helpers.train_runs import start

    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "vllm-lora.log"
    owner = Path(os.environ[TOKEN_FILE_ENV])  # conftest.py's run_token_file
    cmd = [RLKIT, "infer", "-m", str(tiny_model_dir), "--port", str(port), "--lora-rank", "8"]
    cmd += ["--token-file", str(owner), "--tenant", "a", "--tenant", "b"]
    cmd += ["--allowed-weights-root", str(tmp_path_factory.getbasetemp())]
    cmd += ["--max-loras", "2", "--", "--enforce-eager", *TEST_SERVER_ARGS]
    server = ServerProcess(
        process=start(cmd, log), url=f"http://127.0.0.1:{port}", log_path=log, token_file=owner
    )
    try:
        server.wait_ready(timeout=600)
        temp_dir = Path(process_environ(server.pid)["TMPDIR"])
        assert temp_dir.name.startswith(RPC_DIR_PREFIX), temp_dir
        assert any(p.name.startswith("vllm_dist_") for p in temp_dir.iterdir())
        yield server
    finally:
        server.stop()
    assert not temp_dir.exists()
