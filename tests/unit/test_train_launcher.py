"""The trainer's process environment on CPU (`rlkit.launch.launcher.trainer_env`)."""

from __future__ import annotations

import re

import pytest

from rlkit.launch import launcher
from tests.helpers.cli import demo_config


def test_cpu_trainer_waits_passively_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "has_cuda", lambda: False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert launcher.trainer_env("system")["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert launcher.trainer_env("system")["OMP_WAIT_POLICY"] == "ACTIVE"


def test_gpu_trainer_keeps_openmp_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "has_cuda", lambda: True)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert "OMP_WAIT_POLICY" not in launcher.trainer_env("system")


def test_multi_node_trainer_command() -> None:
    """Every node runs the same torchrun c10d command; node 0 hosts the rendezvous store."""
    from rlkit.trainer.main import trainer_command

    cfgs = [
        demo_config(
            "--trainer.nnodes=2",
            "--trainer.nproc_per_node=4",
            f"--trainer.node_rank={rank}",
            "--trainer.rdzv_endpoint=10.0.0.1:29500",
            "--trainer.sharding=hybrid",
        )
        for rank in (0, 1)
    ]
    commands = [trainer_command("t.toml", launcher.trainer_ranks(c), resume=True) for c in cfgs]
    head = commands[0][: commands[0].index("rlkit.trainer.main") - 1]
    assert head[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29500",
        "--rdzv-id",
        head[12],
        "--rdzv-conf",
        "is_host=true",
        "--max-restarts",
        "0",
        "--log-dir",
        "/dev/null",
    ]
    assert head[12].startswith("rlkit-")
    assert commands[1] == [a.replace("is_host=true", "is_host=false") for a in commands[0]]
    assert commands[0][-1] == "--resume"
    # the launch fields stay out of the trainer's own config; sharding goes in
    trainer_cfg = cfgs[0].trainer_config().model_dump()
    assert trainer_cfg["sharding"] == "hybrid"
    assert not {"nnodes", "node_rank", "rdzv_endpoint", "nproc_per_node"} & trainer_cfg.keys()
    one = trainer_command("t.toml", launcher.trainer_ranks(demo_config()), resume=False)
    assert one[1:3] == ["-m", "rlkit.trainer.main"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--trainer.nnodes=2"], "trainer.rdzv_endpoint must be HOST:PORT"),
        (["--trainer.nnodes=2", "--trainer.rdzv_endpoint=node0"], "HOST:PORT"),
        (["--trainer.node_rank=1"], "trainer.node_rank (1) must be below trainer.nnodes (1)"),
        (["--trainer.sharding=hybrid"], "needs trainer.nnodes > 1"),
        (["--trainer.sharding=zero3"], "trainer.sharding"),
        (["--trainer.collective_timeout_s=0"], "trainer.collective_timeout_s"),
    ],
)
def test_bad_launch_fields_name_the_field(overrides: list[str], message: str) -> None:
    from rlkit.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(message)):
        demo_config(*overrides)


def test_nproc_is_not_a_trainer_field() -> None:
    from rlkit.errors import UsageError

    with pytest.raises(UsageError, match=r"trainer\.nproc"):
        demo_config("--trainer.nproc=2")


def test_orchestrator_stops_on_a_reported_trainer_failure(tmp_path) -> None:
    """A trainer node on another machine reports its failure through run_dir; the orchestrator
    raises at once instead of waiting out weights_timeout_s, and a resume clears the report."""
    import asyncio

    from rlkit.orchestrator.loop import TrainerFailed, wait_for_weights
    from rlkit.protocol import handoff

    handoff.report_trainer_failure(tmp_path, "trainer node 0 exited with code 1")
    doorbell = handoff.Doorbell(tmp_path, handoff.ORCHESTRATOR)
    with pytest.raises(TrainerFailed, match="trainer node 0 exited with code 1 before publishing"):
        asyncio.run(wait_for_weights(doorbell, tmp_path, 1, timeout_s=600, trainer_exit=None))
    handoff.clear_stop(tmp_path)
    assert handoff.trainer_failure(tmp_path) is None


def test_the_canary_waits_for_the_trainers_file_and_not_for_a_dead_trainer(tmp_path) -> None:
    """The trainer writes a version's canary after its tensors (`Trainer.publish_canary`): the
    orchestrator's canary waits for the file, fails at once when the trainer exited before
    writing it (its exit code named), and does not wait for an adapter (no record)."""
    import asyncio

    from rlkit.orchestrator.loop import TrainerFailed, wait_for_canary
    from rlkit.protocol.credentials import digest_key, new_token
    from rlkit.protocol.weights import CANARY_FILE, PublishedVersion

    version = tmp_path / "step_000001"
    version.mkdir()
    asyncio.run(wait_for_canary(version, tmp_path, 600, trainer_exit=lambda: 1))  # an adapter
    PublishedVersion.build(1, "filesystem", [], digest_key(new_token())).write(version)
    with pytest.raises(TrainerFailed, match="exited with code 1 before scoring the canary"):
        asyncio.run(wait_for_canary(version, tmp_path, 600, trainer_exit=lambda: 1))

    async def written_later() -> None:
        waiting = asyncio.create_task(wait_for_canary(version, tmp_path, 600, lambda: None))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        (version / CANARY_FILE).write_text("{}")
        await asyncio.wait_for(waiting, 5)

    asyncio.run(written_later())


def test_a_step_fails_soon_after_the_trainer_dies(tmp_path, monkeypatch) -> None:
    """A step waiting for something only the trainer brings (a server's rejoin) fails within a
    poll and a grace period of the trainer's error exit, its work cancelled; a step that fails on
    its own within the grace period keeps its own error; a clean exit lets the work finish."""
    import asyncio
    import time

    from rlkit.orchestrator import loop
    from rlkit.orchestrator.loop import TrainerFailed, while_trainer_lives

    monkeypatch.setattr(loop, "TRAINER_GRACE_S", 0.5)
    cancelled = []

    async def wait_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.append(True)

    def dies_in(seconds: float):
        at = time.monotonic() + seconds
        return lambda: 2 if time.monotonic() > at else None

    started = time.monotonic()
    with pytest.raises(TrainerFailed, match="the trainer exited with code 2 during step 3"):
        asyncio.run(while_trainer_lives(wait_forever(), tmp_path, dies_in(0.3), "during step 3"))
    assert cancelled and time.monotonic() - started < 5

    async def fails_on_its_own() -> None:
        await asyncio.sleep(0.7)  # after the trainer's exit is seen, within the grace period
        raise RuntimeError("the transport saw the trainer go")

    with pytest.raises(RuntimeError, match="the transport saw the trainer go"):
        asyncio.run(while_trainer_lives(fails_on_its_own(), tmp_path, dies_in(0), "step 3"))

    async def finishes() -> None:
        await asyncio.sleep(0.7)  # outlives a poll with the trainer already exited cleanly

    asyncio.run(while_trainer_lives(finishes(), tmp_path, lambda: 0, "during step 3"))
