"""`rlkit train --slurm` submits a real job to a real (one-machine, two-node) SLURM cluster.

`tests.helpers.slurm_cluster` runs Debian's munged, slurmctld and two slurmd ("node1", "node2")
privately.
The tiny CPU demo config gets a `[slurm]` section of one trainer node and one inference node; the
job renders, submits and runs every role with srun on its node, the orchestrator finds the
inference node by address, and the run trains two steps and ends with exit code 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.inference import free_port
from tests.helpers import slurm_cluster
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.system import require_system

pytestmark = [pytest.mark.slow, pytest.mark.system]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_system("SLURM (slurm-wlm, munge)", slurm_cluster.available(), slurm_cluster.FIX)
    cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_train_job_runs_on_a_slurm_cluster(
    cluster: slurm_cluster.SlurmCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        "--slurm",
        "--log.plot=false",
        "--orchestrator.max_steps=2",
        "--orchestrator.eval.at_start=false",
        "--orchestrator.eval.at_end=false",
        "--ckpt.interval=0",
        f"--inference.base_port={free_port()}",
        f"--slurm.rdzv_port={free_port()}",
        "--slurm.time=00:15:00",
        "--slurm.exclusive=false",
        f"--slurm.venv={sys.prefix}",
    )
    done = subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Submitted batch job" in done.stdout
    job_id = done.stdout.split("Submitted batch job")[1].split()[0]

    deadline = time.monotonic() + 900
    while (state := cluster.job_state(job_id)).get("JobState") not in ("COMPLETED", "FAILED"):
        assert state.get("JobState") in ("PENDING", "RUNNING", "COMPLETING"), state
        assert time.monotonic() < deadline, f"job {job_id} still {state.get('JobState')}"
        time.sleep(2)
    output = (run_dir / "slurm" / f"{job_id}.out").read_text()
    logs = "\n".join(
        f"== {log.name}\n{log.read_text(errors='ignore')[-2000:]}"
        for log in sorted((run_dir / "logs").glob("*.log"))
    )
    assert state["JobState"] == "COMPLETED", f"{state}\n{output[-4000:]}\n{logs}"
    assert state["ExitCode"] == "0:0"
    assert "trainer nodes: node1 (rendezvous " in output
    assert "inference nodes: node2 (" in output
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert (run_dir / "weights" / "step_000002" / "STABLE").exists()
