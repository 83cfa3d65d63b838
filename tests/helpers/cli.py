"""Run the `rlkit` console entry point in-process from tests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from rlkit_cli.main import main

from rlkit.machine import has_cuda

ROOT = Path(__file__).resolve().parents[2]
RLKIT = str(Path(sys.executable).parent / "rlkit")


def default_sigint() -> None:
    """`preexec_fn` for a child a test will Ctrl-C: pytest run from a background shell job
    hands SIGINT down ignored, and Python then never installs its KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str
) -> tuple[int | str | None, str]:
    """Run `rlkit ARGS` in-process; returns (exit code, stdout + stderr)."""
    monkeypatch.setattr(sys, "argv", ["rlkit", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def only_run_dir(output_dir: Path) -> Path:
    """The single run directory an eval wrote under `output_dir`."""
    (run_dir,) = list(output_dir.iterdir())
    return run_dir


def clean_rollouts(output_dir: Path, expected: int) -> list:
    """The rollouts of the single eval run under `output_dir`: `expected` many, none errored."""
    from rlkit.eval import load_run

    run = load_run(only_run_dir(output_dir))
    rollouts = [result.rollout for result in run.results]
    assert len(rollouts) == expected
    assert [r.error for r in rollouts if r.error] == []
    assert run.metadata.summary["errors"] == 0
    return rollouts


# A test's own vLLM server may start while the session's (conftest `vllm_server`) still runs: on
# one GPU each takes a fifth of its memory, not the default half, which leaves the second too
# little to start ("Free memory on device ... is less than desired GPU memory utilization"). On
# CPU each keeps a 256 MiB KV cache, not rlkit's default 1 GiB: both xdist workers' session
# servers plus two runs' own engines ran the CI machine out of memory, and the kernel killed
# an engine mid-test.
TEST_SERVER_ARGS = (
    ["--gpu-memory-utilization", "0.2"] if has_cuda() else ["--kv-cache-memory-bytes", "256M"]
)

DEMO_CONFIG = ROOT / "examples/tiny-cpu/train.toml"
# The demo's engine flags plus eager mode (a test run's few steps do not repay torch.compile at
# every engine start; the demo itself and the server tests run compiled) and, on CPU, the test
# servers' small KV cache.
TEST_ENGINE_ARGS = json.dumps(
    [
        *tomllib.loads(DEMO_CONFIG.read_text())["inference"]["extra_args"],
        "--enforce-eager",
        *([] if has_cuda() else TEST_SERVER_ARGS),
    ]
)


# reverse-text's rows under a reward an untrained model earns something from (the plumbing tests
# start from one): tests/integration/envs/reverse-text-lcs, found through RLKIT_ENV_PATH
# (tests/integration/conftest.py and tests/helpers/train_runs.py put that folder there)
SIGNAL_ENV = "reverse-text-lcs"
TEST_ENVS = ROOT / "tests/integration/envs"


def tiny_train_cmd(model: Path, run_dir: Path, *overrides: str) -> list[str]:
    """`rlkit train` on the CPU demo config with `model` and `run_dir`, training on
    `SIGNAL_ENV` (`--env.0.id=reverse-text` puts the demo's environment back); later overrides
    win."""
    return [
        RLKIT,
        "train",
        str(DEMO_CONFIG),
        f"--model.path={model}",
        f"--log.run_dir={run_dir}",
        f"--inference.extra_args={TEST_ENGINE_ARGS}",
        f"--env.0.id={SIGNAL_ENV}",
        *overrides,
    ]


def run_train(cmd: list[str], run_dir: Path, log: Path, timeout: float = 900) -> list[dict]:
    """Run an `rlkit train` command to its end (output in `log`); its metrics records."""
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    assert done.returncode == 0, log.read_text()[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def demo_config(*overrides: str):
    from rlkit.config import load_config
    from rlkit.launch.config import RLJobConfig

    return load_config(RLJobConfig, ROOT / "examples/tiny-cpu/train.toml", list(overrides))


def bridge_workers() -> list[int]:
    """The pids of this process's bridge workers still running: a command that loaded a
    verifiers environment must have closed it (a worker is a whole Python process)."""
    import psutil

    from rlkit.envs.bridge.process import WORKER_SCRIPT

    running = []
    for child in psutil.Process().children(recursive=True):
        try:
            if str(WORKER_SCRIPT) in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                running.append(child.pid)
        except psutil.Error:  # it ended meanwhile
            continue
    return running
