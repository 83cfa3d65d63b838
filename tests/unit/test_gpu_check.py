"""`scripts/gpu_check.sh`: the parts that run without a GPU (options, the plan, refusing to run on
a machine without one, the figures and the table). The GPU run itself needs an NVIDIA machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# scripts/gpu_check.py is an ops script, not a module of rlkit: loaded from its file
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up by name
_spec.loader.exec_module(gpu_check)


def script(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    done = script("--dry-run", f"--work-dir={work}", "--demo-steps=20")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    names = [
        "install gpu extra",
        "model",
        "engine",
        "inference tests",
        "trainer tests",
        "broadcast weight transfer tests",
        "demo, filesystem weights",
        "demo, broadcast weights",
    ]
    positions = [out.index(f". {name} (limit") for name in names]
    assert positions == sorted(positions)  # in this order
    assert f"-e {ROOT}[gpu,dev]" in out
    assert "--size small" in out
    assert "--orchestrator.max_steps=20" in out and "--inference.weight_transfer=broadcast" in out
    assert "tests/integration -k broadcast" in out
    assert not work.exists()  # nothing ran, nothing was written


def test_wheels_install_uses_no_index(tmp_path: Path) -> None:
    args = gpu_check.parse_args(["--wheels", str(tmp_path), "--demo-steps", "3"])
    (install, *_) = gpu_check.build_plan(args)
    assert install.argv[install.argv.index("--no-index") + 1 :][:2] == [
        "--find-links",
        str(tmp_path.resolve()),
    ]
    plan = gpu_check.build_plan(gpu_check.parse_args(["--skip-install"]))
    assert [s.name for s in plan][0] == "model"


def test_only_runs_the_named_steps_and_the_model() -> None:
    args = gpu_check.parse_args(["--skip-install", "--only", "engine", "--only", "trainer tests"])
    assert [s.name for s in gpu_check.build_plan(args)] == ["model", "engine", "trainer tests"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--demo-steps", "1"], "at least 2"),
        (["--only", "engines"], "--only 'engines': no such step; the steps are install gpu extra"),
        (["--wheels", "/no/such/dir"], "not a directory"),
        (["--no-such-option"], "unrecognized arguments"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    done = script(*args)
    assert done.returncode == 2
    assert message in done.stderr


def test_refuses_without_nvidia_smi(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # everything but nvidia-smi: bash, env and the interpreter
    bin_dir.mkdir()
    for tool in ("bash", "env", "dirname"):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    done = script(f"--work-dir={tmp_path / 'work'}", "--skip-install", path=str(bin_dir))
    assert done.returncode == 1
    assert "nvidia-smi not found" in done.stderr
    assert not (tmp_path / "work").exists()


def test_figures_and_table(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    updates = ((1, 9.0), (2, 0.5), (3, 1.5))
    steps = [{"step": i, "weight_update_s": w, "step_time_s": 2.0} for i, w in updates]
    trainer = [{"step": i, "tokens_per_s": t} for i, t in ((1, 10.0), (2, 1000.0), (3, 3000.0))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (run_dir / "trainer_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trainer))
    figures = gpu_check.demo_figures(run_dir, "filesystem")()
    # the first step (warm-up) is left out of every mean
    assert figures == {
        "trainer tokens/s": 2000.0,
        "weight update s (filesystem)": 1.0,
        "step s": 2.0,
    }
    assert gpu_check.demo_figures(tmp_path / "missing", "broadcast")() == {
        "trainer tokens/s": None,
        "weight update s (broadcast)": None,
        "step s": None,
    }
    results = [
        gpu_check.Result("engine", "ok", 31.2, {"engine start s": 24.5}),
        gpu_check.Result("demo, filesystem weights", "ok", 80.0, figures),
        gpu_check.Result("broadcast weight transfer tests", "FAILED (code 1, x.log)", 12.0),
    ]
    table = gpu_check.format_table(["GPU 0: NVIDIA H100"], results).splitlines()
    assert table[0] == "GPUs: GPU 0: NVIDIA H100"
    assert table[1].split() == ["step", "status", "s", "figures"]
    assert "engine start s 24.5" in table[2]
    assert "weight update s (filesystem) 1" in table[3] and "trainer tokens/s 2e+03" in table[3]
    assert "FAILED (code 1, x.log)" in table[4]
    assert table[-1] == "2/3 steps ok"


def test_a_failing_or_slow_step_is_reported_not_raised(tmp_path: Path) -> None:
    ok = gpu_check.Step("fine", [sys.executable, "-c", "print('hi')"], 30)
    bad = gpu_check.Step("broken", [sys.executable, "-c", "raise SystemExit(3)"], 30)
    slow = gpu_check.Step("slow", [sys.executable, "-c", "import time; time.sleep(30)"], 1)
    results = [gpu_check.run_step(step, tmp_path, budget_s=60) for step in (ok, bad, slow)]
    assert [r.status.split(" (")[0] for r in results] == ["ok", "FAILED", "TIMEOUT"]
    assert "code 3" in results[1].status
    assert (tmp_path / "fine.log").read_text() == "hi\n"
    assert gpu_check.run_step(ok, tmp_path, budget_s=0).status == "skipped (out of time)"
