"""A rollout scheduler and a sandbox backend from the user's own module (custom_plugins/
my_plugins.py, outside rlkit), named `module:Class`: `rlkit train` steps with the scheduler, a
sandboxed program and a Python session run through the backend, a backend that cannot run here
fails closed, and unknown names are usage errors naming the field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlkit import sandbox
from rlkit.protocol.batch import read_batch
from rlkit.protocol.weights import PublishedVersion
from rlkit.sandbox.backends import Bwrap
from rlkit.sandbox.session import PythonSession
from tests.helpers.cli import DEMO_CONFIG, run_cli, run_train, tiny_train_cmd
from tests.helpers.session_server import on_session_server
from tests.helpers.system import require_system
from tests.helpers.train_runs import SHORT

PLUGINS = str(Path(__file__).parent / "custom_plugins")


@pytest.fixture
def plugins_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """`my_plugins` importable here and in the processes a test starts."""
    monkeypatch.syspath_prepend(PLUGINS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([PLUGINS, os.environ.get("PYTHONPATH", "")]))


@pytest.mark.system
@pytest.mark.usefixtures("plugins_importable")
async def test_sandboxed_program_runs_with_a_backend_from_a_user_module() -> None:
    problem = Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    sandbox.configure(backend="my_plugins:TaggedBwrap")
    try:
        assert sandbox.require().name == "tagged-bwrap"
        program = "import os; print(os.environ['SANDBOX_BACKEND'], os.getcwd())"
        result = await sandbox.run(program)
        assert (result.status, result.stdout) == ("ok", "tagged-bwrap /sandbox\n"), result.stderr
        async with PythonSession() as py:
            cell = await py.execute("import os; print(os.environ['SANDBOX_BACKEND'])")
        assert (cell.status, cell.output) == ("ok", "tagged-bwrap\n")
        sandbox.configure(backend="my_plugins:MissingTool")  # registered, unusable: fail closed
        with pytest.raises(sandbox.SandboxUnavailable, match="missing-tool runtime"):
            await sandbox.run("print('never runs')")
    finally:
        sandbox.configure(backend="bwrap")


@pytest.mark.usefixtures("plugins_importable")
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("--orchestrator.scheduler=my_plugins:NoSuchScheduler", "orchestrator.scheduler"),
        ("--orchestrator.scheduler=my_plugins:RECORD", "orchestrator.scheduler"),
        ("--sandbox.backend=firecracker", "sandbox.backend"),
        ("--sandbox.backend=my_plugins:OneGroupScheduler", "sandbox.backend"),
        ("--inference.weight_transfer=my_plugins:NoSuchTransport", "inference.weight_transfer"),
        ("--inference.weight_transfer=my_plugins:OneGroupScheduler", "inference.weight_transfer"),
        ("--inference.weight_transfer=pigeon", "inference.weight_transfer"),
    ],
)
def test_unknown_plugins_are_usage_errors_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, override: str, field: str
) -> None:
    code, output = run_cli(monkeypatch, capsys, "train", str(DEMO_CONFIG), "--dry-run", override)
    assert code == 2 and field in output, output


@pytest.mark.usefixtures("plugins_importable")
def test_a_plugin_scheduler_gets_its_own_parameter_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    plugin = "--orchestrator.scheduler=my_plugins:OneGroupScheduler"
    args = ["train", str(DEMO_CONFIG), "--dry-run", plugin]
    table = '--orchestrator.schedulers."my_plugins:OneGroupScheduler"'
    code, output = run_cli(monkeypatch, capsys, *args, f"{table}.record=b")
    assert code == 0 and 'record = "b"' in output, output
    code, output = run_cli(monkeypatch, capsys, *args, f"{table}.nope=1")
    assert code == 2 and 'orchestrator.schedulers."my_plugins:OneGroupScheduler".nope' in output


@pytest.mark.slow
@pytest.mark.usefixtures("plugins_importable")
def test_rlkit_train_steps_with_a_scheduler_from_a_user_module(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            *urls,
            "--orchestrator.scheduler=my_plugins:OneGroupScheduler",
            "--sandbox.backend=my_plugins:TaggedBwrap",
        )
        records = run_train(cmd, run_dir, tmp_path / "run.log")
    assert [r["step"] for r in records] == [1, 2]
    assert 'scheduler = "my_plugins:OneGroupScheduler"' in (run_dir / "config.toml").read_text()
    taken = [json.loads(line) for line in (run_dir / "one_group_batches.jsonl").open()]
    assert len(taken) == 2 and all(len(uids) == 1 for uids in taken)
    for step, uids in enumerate(taken, start=1):  # what the trainer got is what it returned
        batch = read_batch(run_dir / "batches" / f"step_{step:06d}.pt")
        assert batch.meta["group_uids"] == uids
        assert {s.env_id for s in batch.samples} == {"reverse-text-lcs"}


@pytest.mark.slow
@pytest.mark.usefixtures("plugins_importable")
def test_rlkit_train_steps_with_a_weight_transport_from_a_user_module(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Every version goes through the user's transport (a checkpoint step's as files), reaches
    the real vLLM CPU server, and passes the worker's table check and the canary."""
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        "--orchestrator.max_steps=3",
        "--ckpt.interval=2",
        "--inference.weight_transfer=my_plugins:FilePerTensor",
    )
    records = run_train(cmd, run_dir, tmp_path / "run.log")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["weights_canary_kl"] < 1e-2 for r in records), records
    for step, transport in ((1, "my_plugins:FilePerTensor"), (2, "filesystem")):
        record = PublishedVersion.read(run_dir / "weights" / f"step_{step:06d}")
        assert record is not None and record.transport == transport
    assert list((run_dir / "weights" / "step_000003" / "tensors").glob("*.safetensors"))
