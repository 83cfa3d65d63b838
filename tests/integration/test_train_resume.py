"""Resume loses nothing: `rlkit train` killed with SIGKILL at three points and resumed trains
the uninterrupted run's prompts, every step once, for both schedulers.

The prompt stream depends only on the seed (difficulty pools and zero-advantage dropping off)
and every completion is exactly 8 tokens (min_tokens = max_tokens), so a c3po step takes exactly
two groups: which prompts a run trains depends on its data path alone, not on sampled lengths.
c3po keeps two groups in flight while the trainer trains, so every checkpoint leaves prompts
handed out but untrained (in flight or waiting in the pool).

One run per scheduler is killed (SIGKILL to the launcher's process group, as `kill -9 -PGID`)
and resumed three times:
1. before the first checkpoint (resumes from scratch); the c3po run launched its own inference
   server, which must die with it,
2. right after the checkpoint of step 6 (c3po: with prompts in flight),
3. at step 9 or later, 3+ steps after that checkpoint (ckpt.interval 6: the orchestrator's
   state of step 6 must still be there),
then runs to step 12 and is compared with one uninterrupted run of the same config. The other
runs and the reference use the session's server (an engine start less each). (This replaces the
liveness test that SIGKILLed the launcher once, mid-run, and resumed.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from rlkit.runs.audit import audit_run
from tests.helpers.cli import run_train, tiny_train_cmd
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import records, start

pytestmark = pytest.mark.slow

STEPS = 12
INTERVAL = 6
AFTER = 3  # kill point 3: this many steps after the checkpoint, before the next
COMMON = [
    f"--orchestrator.max_steps={STEPS}",
    f"--ckpt.interval={INTERVAL}",
    f"--trainer.weights.keep_last={INTERVAL + 1}",
    "--orchestrator.eval.at_start=false",
    "--orchestrator.eval.at_end=false",
    "--log.plot=false",
    "--orchestrator.difficulty.enabled=false",
    "--orchestrator.drop_zero_advantage=false",
    "--orchestrator.sampling={temperature = 1.0, max_tokens = 8, min_tokens = 8}",
    "--orchestrator.group_size=4",
    # the tiny random model may earn LCS reward 0 in every group for steps on end (a run did
    # from step 3): the watchdog would stop the run, which this test does not test
    "--orchestrator.watchdog.stop_groups=1000",
]
SCHEDULERS = {
    "sync": ["--orchestrator.scheduler=sync", "--orchestrator.schedulers.sync.batch_groups=2"],
    "c3po": [
        "--orchestrator.scheduler=c3po",
        "--orchestrator.schedulers.c3po.capacity=8",  # two groups in flight
        "--orchestrator.schedulers.c3po.token_budget=64",  # two groups of 4 x 8 tokens a step
        "--orchestrator.schedulers.c3po.retention=4",  # nothing purged, nothing too stale
        "--orchestrator.max_off_policy_steps=4",
    ],
}


def train_cmd(model: Path, run_dir: Path, scheduler: str, *extra: str) -> list[str]:
    return tiny_train_cmd(model, run_dir, *COMMON, *SCHEDULERS[scheduler], *extra)


def prompts_per_step(run_dir: Path) -> dict[int, list[tuple[str, int]]]:
    import torch

    out = {}
    for path in sorted((run_dir / "batches").glob("step_*.pt")):
        meta = torch.load(path, weights_only=True)["meta"]
        out[int(path.stem.removeprefix("step_"))] = [
            (p["env_id"], p["index"]) for p in meta["prompts"]
        ]
    return out


def steps_of(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module", params=list(SCHEDULERS))
def reference(
    request: pytest.FixtureRequest,
    vllm_server,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, Path]:
    """One uninterrupted run per scheduler, on the session's server: the prompts a run trains
    depend on its data path alone, not on which server sampled them."""
    scheduler = request.param
    run_dir = tmp_path_factory.mktemp(f"reference-{scheduler}") / "run"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = train_cmd(tiny_model_dir, run_dir, scheduler, *urls)
        run_train(cmd, run_dir, run_dir.parent / "log")
    return scheduler, run_dir


def latest_checkpoint(run_dir: Path) -> str | None:
    pointer = run_dir / "checkpoints" / "latest"
    return pointer.read_text().strip() if pointer.exists() else None


def wait_until(proc: subprocess.Popen, done, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"run exited with {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_run(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGKILL the launcher's process group; its children (trainer, servers, each in its own
    session) must all die with it."""
    pids = json.loads((run_dir / "pids.json").read_text())
    groups = [pid for role in pids.values() for pid in role]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [g for g in groups if group_alive(g)]
    for pgid in survivors:
        os.killpg(pgid, signal.SIGKILL)
    assert not survivors, f"process groups {survivors} of {pids} outlived the kill"


def test_sigkill_at_three_points_and_resume_trains_every_prompt_once(
    reference: tuple[str, Path], vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    scheduler, ref_dir = reference
    run_dir = tmp_path / "run"
    logs = iter(tmp_path / f"run{i}.log" for i in range(4))

    def launch(*extra: str) -> subprocess.Popen:
        log = next(logs)
        proc = start(train_cmd(tiny_model_dir, run_dir, scheduler, *extra), log)
        proc.log = log  # type: ignore[attr-defined]
        return proc

    def pids() -> dict[str, list[int]]:
        return json.loads((run_dir / "pids.json").read_text())

    def logged() -> int:
        return max((r["step"] for r in records(run_dir)), default=0)

    with on_session_server(vllm_server, tiny_model_dir) as urls:  # the server is restored
        # 1. before the first checkpoint; the c3po run with a server of its own, which must die
        # with it (once is enough: the sync run starts on the session's, an engine start less)
        own_server = scheduler == "c3po"
        proc = launch(*([] if own_server else urls))
        wait_until(proc, lambda: logged() >= 1, "step 1")
        assert bool(pids().get("inference")) == own_server, pids()
        kill_run(proc, run_dir)
        assert latest_checkpoint(run_dir) is None

        # 2. right after the checkpoint of step 6
        proc = launch("--resume", *urls)
        wait_until(proc, lambda: latest_checkpoint(run_dir) is not None, "checkpoint")
        kill_run(proc, run_dir)
        assert "resume: rolled back to the start" in proc.log.read_text()
        assert latest_checkpoint(run_dir) == f"step_{INTERVAL:06d}"
        state = json.loads((run_dir / "orchestrator" / f"step_{INTERVAL:06d}.json").read_text())
        if scheduler == "c3po":
            assert state["prompts"]["owed"], "no prompt in flight or pooled at the checkpoint"

        # 3. 3+ steps after the last checkpoint
        proc = launch("--resume", *urls)
        wait_until(proc, lambda: logged() >= INTERVAL + AFTER, f"step {INTERVAL + AFTER}")
        kill_run(proc, run_dir)
        text = proc.log.read_text()
        assert f"resume: rolled back to step {INTERVAL}'s checkpoint" in text
        assert f"{len(state['prompts']['owed'])} prompts handed out but untrained" in text
        assert latest_checkpoint(run_dir) == f"step_{INTERVAL:06d}", "killed too late"

        proc = launch("--resume", *urls)
        assert proc.wait(timeout=300) == 0, proc.log.read_text()[-3000:]
    assert f"resume: rolled back to step {INTERVAL}'s checkpoint, discarding steps" in (
        proc.log.read_text()
    )

    for name in ("metrics.jsonl", "trainer_metrics.jsonl"):
        assert steps_of(run_dir / name) == list(range(1, STEPS + 1)), name
    ours, ref = prompts_per_step(run_dir), prompts_per_step(ref_dir)
    assert sorted(ours) == sorted(ref) == list(range(1, STEPS + 1))
    if scheduler == "sync":
        assert ours == ref
    else:
        assert Counter(p for ps in ours.values() for p in ps) == Counter(
            p for ps in ref.values() for p in ps
        )
    for path in (run_dir, ref_dir):
        report = audit_run(path)
        assert report.ok, report.violations
