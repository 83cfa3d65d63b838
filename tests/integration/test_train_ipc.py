"""`rlkit train --inference.weight_transfer=ipc` against the real vLLM CPU server: every version
reaches the server through the trainer's shared buffer (checkpoint steps as files; the same
buffer filled again: the workers let their mappings go once loaded), the canary KL after each
ipc update is as small as after the filesystem update of the same run, nothing is left in
/dev/shm; a server whose worker is killed mid-update (by a transport of the test's own,
`faulty_transports`, after it mapped the buffer) is relaunched and catches up from the buffer
the trainer still holds, while the run goes on to its end; and a trainer SIGKILLed once it
published a version through its buffer, before any server loaded it, stops the run at once with
the one line that says to resume, leaves nothing in /dev/shm, and `--resume` trains to the end."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from rlkit.protocol import handoff
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.weights import PublishedVersion
from rlkit.weights.ipc import IpcDelivery
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import SHORT, records, run, start

pytestmark = pytest.mark.slow
STEPS = 5
CKPT = 4  # step 4 is published as files (a checkpoint step), the others through the buffer


def rlkit_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "rlkit" in n or n.startswith("torch_")}


def test_ipc_updates_match_the_filesystem_ones_and_leave_nothing_behind(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    before = rlkit_shm()
    run_dir = tmp_path / "run"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            *urls,
            f"--orchestrator.max_steps={STEPS}",
            f"--ckpt.interval={CKPT}",
            "--inference.weight_transfer=ipc",
        )
        log = tmp_path / "run.log"
        assert run(cmd, log) == 0, log.read_text()[-3000:]
    steps = records(run_dir)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    kls = {r["step"]: r["weights_canary_kl"] for r in steps}
    assert all(kl is not None for kl in kls.values()), kls
    by_ipc = [kl for step, kl in kls.items() if step != CKPT]
    assert max(by_ipc) < max(10 * kls[CKPT], 1e-3), kls
    weights = run_dir / "weights"
    shared = PublishedVersion.read(weights / "step_000005")
    assert shared is not None and shared.transport == "ipc"
    assert not list((weights / "step_000005").glob("*.safetensors"))  # nothing written
    assert PublishedVersion.read(weights / f"step_{CKPT:06d}").transport == "filesystem"
    assert all(r["weight_update_bytes"] == shared.nbytes for r in steps)
    earlier = PublishedVersion.read(weights / "step_000003")
    assert IpcDelivery.of(earlier).name == IpcDelivery.of(shared).name  # filled again
    assert rlkit_shm() == before


def test_a_worker_killed_mid_update_catches_up_from_the_buffer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    before = rlkit_shm()
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        "--orchestrator.max_steps=4",
        "--ckpt.interval=0",
        # ipc, whose only server's worker exits at version 2, once: its relaunch loads version 2
        # from the buffer
        "--inference.weight_transfer=faulty_transports:IpcKilledOnce",
        "--inference.health_interval_s=1",
    )
    log = tmp_path / "run.log"
    assert run(cmd, log) == 0, log.read_text()[-3000:]
    steps = records(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    output = log.read_text()
    assert "is down" in output and "is back (policy version 2)" in output, output[-3000:]
    assert steps[-1]["inference_servers_rejoined"] >= 1
    assert (run_dir / "killed-once").exists()
    assert all(r["weights_canary_kl"] < 1e-2 for r in steps[2:]), steps
    assert rlkit_shm() == before


def wait_stopped(pid: int, states: str = "tT", timeout: float = 30) -> None:
    """Until every thread of `pid` is in one of `states`: stopped (SIGSTOP takes effect
    asynchronously), or "Z" for a SIGKILLed process torn down (its memory and files released)."""
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")

    def state(task: Path) -> str:
        try:
            return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # a thread that ended since the listing
            return states[0]

    while not all(state(t) in states for t in tasks.iterdir()):
        assert time.monotonic() < deadline, f"pid {pid} did not reach state {states}"
        time.sleep(0.01)


def wait_for(proc, done, what: str, timeout: float = 600, every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"run exited with {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(every)


def test_a_trainer_killed_mid_update_stops_the_run_resumably(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The launcher (the orchestrator) is stopped once it wrote step N's batch, so that the
    trainer publishes version N through its buffer and is SIGKILLed before any server loads it;
    then the launcher goes on, finds the trainer gone (not yet reaped: a zombie) and stops. On a
    loaded machine the launcher may stop only after version N was published (it may have
    delivered it): then it goes on and the next step is tried."""
    before = rlkit_shm()
    run_dir = tmp_path / "run"
    layout = RunLayout(run_dir)
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            "--orchestrator.max_steps=8",
            "--ckpt.interval=2",
            "--inference.weight_transfer=ipc",
            *urls,
        )
        proc = start(cmd, tmp_path / "killed.log")
        try:
            for step in (3, 5, 7):  # ipc versions: even steps are checkpoints, sent as files
                wait_for(proc, layout.batch(step).exists, f"step {step}'s batch")
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    wait_stopped(proc.pid)
                    version = layout.weights_version(step)
                    if handoff.is_published(version):  # stopped too late: it may be delivered
                        continue
                    deadline = time.monotonic() + 300
                    while not handoff.is_published(version):
                        assert time.monotonic() < deadline, f"version {step} never published"
                        time.sleep(0.05)
                    record = PublishedVersion.read(version)
                    assert record is not None and record.transport == "ipc"
                    trainer = IpcDelivery.of(record).pid
                    assert [trainer] == json.loads((run_dir / "pids.json").read_text())["trainer"]
                    os.kill(trainer, signal.SIGKILL)
                    killed = time.monotonic()
                    # torn down (the buffer gone) before the launcher goes on: a server mapping
                    # the buffer while the kill is under way would still load the version
                    wait_stopped(trainer, "Z")
                    break
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
            else:
                pytest.fail("the launcher was never stopped before a version reached the server")
            code = proc.wait(timeout=120)
            stopped_s = time.monotonic() - killed
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        output = (tmp_path / "killed.log").read_text()
        assert code == 1, output[-3000:]
        assert stopped_s < 60, stopped_s
        assert f"the trainer (pid {trainer}) exited before policy version {step}" in output
        assert "continue with --resume" in output and "Traceback" not in output, output[-3000:]
        assert [r["step"] for r in records(run_dir)] == list(range(1, step))
        saved = (step - 1) // 2 * 2
        assert layout.latest_checkpoint() == layout.checkpoint(saved)
        assert rlkit_shm() == before

        resumed = tmp_path / "resumed.log"
        assert run([*cmd, "--resume"], resumed) == 0, resumed.read_text()[-3000:]
    assert f"resuming at step {saved + 1}" in resumed.read_text()
    steps = records(run_dir)
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert all(r["weights_canary_kl"] < 1e-2 for r in steps), steps
    assert rlkit_shm() == before
