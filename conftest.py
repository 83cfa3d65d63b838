"""Shared pytest fixtures for the whole repository (tests/ and environments/*/tests).

Models are built locally (no downloads) once per session. The real vLLM CPU server is started
once per session and shared, `rlkit train` runs included (tests/helpers/session_server.py: an
engine start less per run); tests that change its weights must restore them, and tests that
kill, restart or reconfigure a server start their own (`rlkit.inference.start_server`). Under
pytest-xdist (`scripts/test.sh`) a session is one worker's: each worker has its own models and
servers, under its own temporary folder; the files on the LoRA server share one worker
(tests/helpers/scheduling.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helpers' asserts show their values on failure, as a test module's do (a bare
# `AssertionError` from `clean_rollouts` said nothing about which rollout failed or why).
pytest.register_assert_rewrite("tests.helpers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# verifiers bridge venvs: built once (per CI run, per checkout) and reused by every test
os.environ.setdefault("RLKIT_BRIDGE_VENVS", str(Path(__file__).parent / ".cache" / "bridge-venvs"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each file's (or xdist group's) total test seconds to PATH as JSON: the "
        "order `scripts/test.sh` hands files to its workers (tests/durations.json)",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # the controller sees every report
        from tests.helpers.scheduling import DurationRecorder

        config.pluginmanager.register(DurationRecorder(Path(path)), "rlkit-durations")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` (scripts/test.sh) as whole files plus groups, longest first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.helpers.scheduling import FilesAndGroups

    return FilesAndGroups(config, log)


@pytest.fixture(scope="session", autouse=True)
def run_token_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tests' run credential (`RLKIT_TOKEN_FILE`): the servers tests start hold it, and
    what tests publish is signed with it, as a run's trainer signs its versions. `rlkit train`
    runs make their own."""
    from rlkit.protocol.credentials import TOKEN_FILE_ENV, write_token_file

    path = tmp_path_factory.mktemp("credentials") / "token"
    write_token_file(path)
    before = os.environ.get(TOKEN_FILE_ENV)
    os.environ[TOKEN_FILE_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(TOKEN_FILE_ENV, None)
    else:
        os.environ[TOKEN_FILE_ENV] = before


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense Qwen3 (HF format, bf16, local BPE tokenizer), seed 0."""
    from rlkit.models import init_tiny

    return init_tiny(tmp_path_factory.mktemp("models") / "tiny-qwen3", arch="qwen3", seed=0)


@pytest.fixture(scope="session")
def tiny_moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE, seed 0."""
    from rlkit.models import init_tiny

    return init_tiny(tmp_path_factory.mktemp("models") / "tiny-qwen3-moe", arch="qwen3-moe", seed=0)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real vLLM server (CPU, or GPU where there is one) on 127.0.0.1 serving `tiny_model_dir`;
    model name is its path. Clients need its token: `vllm_server.client()`, `.headers`,
    `.token_file` (`rlkit eval --token-file`); weights load from the tests' temporary folders."""
    from rlkit.inference import start_server
    from tests.helpers.cli import TEST_SERVER_ARGS

    log = tmp_path_factory.mktemp("logs") / "vllm-session.log"
    server = start_server(
        str(tiny_model_dir),
        log_path=log,
        extra_args=TEST_SERVER_ARGS,
        weights_roots=[tmp_path_factory.getbasetemp()],  # any test's tmp_path
    )
    try:
        server.wait_ready(timeout=600)
        yield server
    finally:
        server.stop()
