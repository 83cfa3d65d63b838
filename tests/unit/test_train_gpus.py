"""GPUs per role (`rlkit.launch.gpus`): checked against the machine before anything starts, each
role's CUDA_VISIBLE_DEVICES and vLLM's memory fraction; on this CPU machine through the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.launch import gpus, launcher
from tests.helpers.cli import ROOT, demo_config, run_cli

EIGHT = [str(i) for i in range(8)]


def test_roles_get_disjoint_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "machine_gpus", lambda: EIGHT)
    cfg = demo_config(
        "--inference.num_servers=2",
        "--inference.gpus=[0, 1, 2, 3]",
        "--trainer.gpus=[4, 5, 6, 7]",
        "--trainer.nproc_per_node=4",
    )
    plan = gpus.plan_gpus(cfg, "all")
    assert plan.servers == ["0,1", "2,3"] and plan.trainer == "4,5,6,7"
    assert gpus.plan_gpus(cfg, "trainer") == gpus.GpuPlan(servers=[], trainer="4,5,6,7")
    assert gpus.plan_gpus(cfg, "inference").trainer is None
    assert gpus.plan_gpus(cfg, "orchestrator") == gpus.GpuPlan(servers=[], trainer=None)


def test_indices_count_the_devices_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a scheduler that set CUDA_VISIBLE_DEVICES, index 0 is its first device."""
    monkeypatch.setenv(gpus.VISIBLE, "4,5,6,7")
    assert gpus.machine_gpus() == ["4", "5", "6", "7"]
    cfg = demo_config("--inference.gpus=[0]", "--trainer.gpus=[2, 3]", "--trainer.nproc_per_node=2")
    assert gpus.plan_gpus(cfg, "all") == gpus.GpuPlan(servers=["4"], trainer="6,7")


@pytest.mark.parametrize(
    ("available", "overrides", "message"),
    [
        ([], ["--trainer.gpus=[0]"], "trainer.gpus = [0]: this machine has no GPU"),
        (EIGHT[:2], ["--inference.gpus=[1, 2]"], "GPU 2 does not exist; this machine has 2 GPU"),
        (EIGHT, ["--inference.gpus=[0, 1]", "--trainer.gpus=[1]"], "share GPU(s) [1]"),
    ],
)
def test_machine_checks(
    monkeypatch: pytest.MonkeyPatch, available: list[str], overrides: list[str], message: str
) -> None:
    monkeypatch.setattr(gpus, "machine_gpus", lambda: available)
    with pytest.raises(UsageError, match=re.escape(message)):
        gpus.plan_gpus(demo_config(*overrides), "all")


def test_roles_on_different_machines_may_use_the_same_indices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpus, "machine_gpus", lambda: EIGHT)
    cfg = demo_config("--inference.gpus=[0]", "--trainer.gpus=[0]")
    assert gpus.plan_gpus(cfg, "trainer").trainer == "0"
    assert gpus.plan_gpus(cfg, "inference").servers == ["0"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--inference.gpus=[0, 0]"], "inference.gpus = [0, 0]: GPU indices must be distinct"),
        (["--inference.gpus=[0, 1, 2]", "--inference.num_servers=2"], "must split evenly"),
        (["--trainer.gpus=[0, 1]"], "trainer.gpus lists 2 GPU(s) but trainer.nproc_per_node is 1"),
        (["--inference.gpu_memory_utilization=1.5"], "inference.gpu_memory_utilization"),
    ],
)
def test_config_checks(overrides: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        demo_config(*overrides)


def test_server_and_trainer_processes_get_their_devices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the launcher hands each child: CUDA_VISIBLE_DEVICES and, on GPU, vLLM's fraction."""
    started: list[dict] = []
    monkeypatch.setattr(launcher, "has_cuda", lambda: True)
    monkeypatch.setattr(launcher, "start_server", lambda model, **kw: started.append(kw))
    cfg = demo_config("--inference.gpus=[0, 1]", "--inference.num_servers=2")
    fleet = launcher.ServerFleet(cfg, tmp_path, console=None, devices=["0", "1"])
    fleet._launch(1, None)
    assert started[0]["env"][gpus.VISIBLE] == "1"
    assert started[0]["extra_args"][:2] == ["--gpu-memory-utilization", "0.9"]
    assert started[0]["extra_args"][2:] == list(cfg.inference.extra_args)
    shared = launcher.ServerFleet(demo_config(), tmp_path, console=None, devices=[None])
    shared._launch(0, None)
    assert gpus.VISIBLE not in started[1]["env"]
    assert started[1]["extra_args"][:2] == ["--gpu-memory-utilization", "0.5"]
    monkeypatch.setattr(launcher, "has_cuda", lambda: False)  # CPU: vLLM's CPU flags only
    shared._launch(0, None)
    assert "--gpu-memory-utilization" not in started[2]["extra_args"]


def test_cli_refuses_gpus_on_a_machine_without_them(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    tiny_model_dir: Path,
) -> None:
    monkeypatch.delenv(gpus.VISIBLE, raising=False)
    model = tiny_model_dir
    code, out = run_cli(
        monkeypatch,
        capsys,
        "train",
        str(ROOT / "examples/tiny-cpu/train.toml"),
        f"--model.path={model}",
        f"--log.run_dir={tmp_path / 'run'}",
        "--trainer.gpus=[0]",
    )
    assert code == 2, out
    assert "trainer.gpus = [0]: this machine has no GPU" in out
    assert not (tmp_path / "run").exists()
