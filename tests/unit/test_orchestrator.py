"""Orchestrator pieces without servers: config validation, sampler, batching, metrics, state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.config import load_config
from rlkit.envs import Rollout, Turn
from rlkit.envs.exploits import Exploit
from rlkit.errors import UsageError
from rlkit.launch.config import RLJobConfig
from rlkit.orchestrator.batching import GroupProcessor, make_batch
from rlkit.orchestrator.config import DifficultyConfig
from rlkit.orchestrator.metrics import MetricsLogger, step_record, truncate_jsonl
from rlkit.orchestrator.prompts import Prompt
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Counters, Group
from rlkit.orchestrator.state import check_fresh_run_dir, prepare_resume, save_state
from rlkit.protocol.batch import read_batch, write_batch

BASE = """
[model]
path = "/tmp/model"
[[env]]
id = "reverse-text"
[orchestrator]
schedulers.c3po.token_budget = 512
sampling = { max_tokens = 64 }
"""


def config(tmp_path: Path, text: str = BASE, overrides: list[str] | None = None) -> RLJobConfig:
    path = tmp_path / "train.toml"
    path.write_text(text)
    return load_config(RLJobConfig, path, overrides)


def test_config_defaults_and_overrides(tmp_path: Path) -> None:
    cfg = config(tmp_path, overrides=["--orchestrator.group_size", "4", "--loss.name=grpo"])
    assert cfg.orchestrator.group_size == 4 and cfg.loss.name == "grpo"
    trainer = cfg.trainer_config()
    assert trainer.run_dir == cfg.log.run_dir and trainer.model.path == "/tmp/model"
    assert trainer.max_steps == cfg.orchestrator.max_steps


@pytest.mark.parametrize(
    ("override", "field"),
    [
        (
            "orchestrator.schedulers.c3po.token_budget=-5",
            "orchestrator.schedulers.c3po.token_budget",
        ),
        (
            "orchestrator.schedulers.c3po.token_budget=10",
            "orchestrator.schedulers.c3po.token_budget",
        ),
        ("orchestrator.schedulers.c3po.capacity=2", "orchestrator.schedulers.c3po.capacity"),
        (
            "orchestrator.schedulers.c3po.batch_groups=2",
            "orchestrator.schedulers.c3po.batch_groups: unknown field; did you mean "
            "orchestrator.schedulers.sync.batch_groups",
        ),
        (
            "orchestrator.schedulers.fast.x=1",
            r"orchestrator\.schedulers\.fast: unknown scheduler 'fast'",
        ),
        (
            "orchestrator.capacity=16",
            r"orchestrator\.capacity moved to \[orchestrator\.schedulers\.c3po\] "
            r"\(orchestrator\.schedulers\.c3po\.capacity\)",
        ),
        (
            "orchestrator.batch_groups=2",
            r"orchestrator\.batch_groups moved to \[orchestrator\.schedulers\.sync\]",
        ),
        ("orchestrator.schedular=sync", "orchestrator.schedular"),
        ("orchestrator.scheduler=fast", "orchestrator.scheduler"),
        ("trainer.run_dir=/x", "trainer.run_dir"),
        (
            "orchestrator.difficulty={easy_fraction = 0.8, hard_fraction = 0.3}",
            "easy_fraction + hard_fraction",
        ),
        ("loss.name=ppo", "loss.name: .*unknown loss 'ppo'"),
        ("loss.name=no_such_module_xyz:fn", "loss.name: .*cannot import no_such_module_xyz"),
        ("loss.params.alpha=2", "loss: .*params.alpha: Input should be less than or equal to 1"),
        ("loss.params.clip_c=3", "loss: .*params.clip_c: unknown field"),
        ("loss.mismatch_correction=mask", "loss.mismatch_correction"),
        ("trainer.mini_batches=0", "trainer.mini_batches"),
        ("orchestrator.advantage=ppo", "orchestrator: .*unknown advantage estimator 'ppo'"),
        ("orchestrator.advantage_params.eps=0", "advantage_params.eps: Input should be greater"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, override: str, field: str) -> None:
    literal = ".*" not in field and "\\" not in field
    pattern = field.replace(".", r"\.").replace("+", r"\+") if literal else field
    with pytest.raises(UsageError, match=pattern):
        config(tmp_path, overrides=[f"--{override}"])


def test_each_scheduler_reads_its_own_table_and_the_old_tables_still_load(
    tmp_path: Path,
) -> None:
    """[orchestrator.schedulers.<name>] for built-ins and plugins alike; a table for a scheduler
    not chosen is validated too (simulate compares it); the old [orchestrator.sync|c3po] and
    scheduler_params tables (a resumed run's config.toml) load into it with a warning."""
    cfg = config(tmp_path, overrides=["--orchestrator.schedulers.sync.batch_groups=3"])
    o = cfg.orchestrator
    assert o.scheduler == "c3po" and o.scheduler_settings.model_dump()["token_budget"] == 512
    assert o.params_for("sync").model_dump() == {"batch_groups": 3}
    assert o.schedulers["c3po"]["capacity"] == 64  # the dumped table shows the defaults
    old = BASE.replace("schedulers.c3po.token_budget = 512", "c3po.token_budget = 512")
    with pytest.warns(DeprecationWarning, match=r"\[orchestrator\.schedulers\.c3po\]"):
        again = config(tmp_path, old)
    assert again.orchestrator.schedulers == {"c3po": o.schedulers["c3po"]}
    plugin = ["--orchestrator.scheduler=sync", "--orchestrator.scheduler_params.batch_groups=5"]
    with pytest.warns(DeprecationWarning, match=r"scheduler_params\] is now .*schedulers\.sync"):
        assert config(tmp_path, overrides=plugin).orchestrator.scheduler_settings.model_dump() == {
            "batch_groups": 5
        }


@pytest.mark.slow  # three `rlkit train` processes
def test_cli_bad_config_exits_2_and_starts_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    run_dir = tmp_path / "run"
    path.write_text(BASE.replace("reverse-text", "no-such-env-xyz"))
    rlkit = str(Path(sys.executable).parent / "rlkit")
    cli = [rlkit, "train", str(path), f"--log.run_dir={run_dir}", f"--model.path={tiny_model_dir}"]
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "env.0.id" in proc.stderr
    assert not run_dir.exists()
    proc = subprocess.run(
        [*cli, "--orchestrator.schedulers.c3po.token_budget", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "orchestrator.schedulers.c3po.token_budget" in proc.stderr
    assert not run_dir.exists()
    proc = subprocess.run(
        [*cli, "--loss.params.beta", "0.5"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "params.beta" in proc.stderr
    assert not run_dir.exists()


def test_evaluation_only_environment_is_refused_for_training(tmp_path: Path) -> None:
    from rlkit.launch.config import check_environments

    cfg = config(tmp_path, BASE.replace('id = "reverse-text"', 'id = "math"'))
    with pytest.raises(UsageError, match=r"env\.0\.args: .*no training set"):
        check_environments(cfg)


def test_environments_loaded_before_a_refusal_are_closed(tmp_path: Path, monkeypatch) -> None:
    """A refused config leaves no environment open (a bridged one keeps a worker process)."""
    from rlkit.envs.environment import Environment
    from rlkit.launch.config import check_environments

    closed: list[str] = []
    monkeypatch.setattr(Environment, "close", lambda self: closed.append(self.env_id))
    cfg = config(tmp_path, BASE.replace("[orchestrator]", '[[env]]\nid = "math"\n[orchestrator]'))
    with pytest.raises(UsageError, match=r"env\.1\.args: .*no training set"):
        check_environments(cfg)
    assert closed == ["reverse-text", "math"]

    from rlkit.launch import launcher  # and `run_train` closes them when its role ends

    closed.clear()
    monkeypatch.setattr(launcher, "check_model_dir", lambda path: None)
    monkeypatch.setattr(launcher, "_run_role", lambda *args: {"ran": True})
    assert launcher.run_train(config(tmp_path)) == {"ran": True}
    assert closed == ["reverse-text"]


def test_sampler_mixes_by_weight_and_moves_difficulty() -> None:
    sampler = PromptSampler(
        {"a": 10, "b": 10},
        {"a": 3.0, "b": 1.0},
        DifficultyConfig(easy_fraction=0.0, hard_fraction=0.0),
        seed=0,
    )
    draws = [sampler.sample() for _ in range(400)]
    share_a = sum(env == "a" for env, _ in draws) / len(draws)
    assert 0.65 < share_a < 0.85
    sampler.observe("a", 3, [1.0, 1.0])  # solved every time -> easy, never drawn (fraction 0)
    sampler.observe("a", 4, [0.0, 0.0])  # never solved -> hard
    sampler.observe("a", 5, [1.0, 0.0])  # in between -> normal
    assert sampler.counts("a") == {"easy": 1, "normal": 8, "hard": 1}
    assert all(i not in (3, 4) for env, i in (sampler.sample() for _ in range(200)) if env == "a")


def test_sampler_state_round_trip_continues_the_stream() -> None:
    settings = DifficultyConfig(easy_fraction=0.2, hard_fraction=0.2)
    a = PromptSampler({"x": 7, "y": 5}, {"x": 1.0, "y": 1.0}, settings, seed=3)
    for _ in range(9):
        a.sample()
    a.observe("x", 2, [1.0])
    a.observe("y", 1, [0.0])
    state = json.loads(json.dumps(a.state_dict()))
    b = PromptSampler({"x": 7, "y": 5}, {"x": 1.0, "y": 1.0}, settings, seed=3)
    b.load_state_dict(state)
    assert [a.sample() for _ in range(30)] == [b.sample() for _ in range(30)]


def test_sampler_reads_each_epoch_once_in_its_own_order() -> None:
    """Every example once per epoch; each epoch shuffled anew (the order is kept per epoch)."""
    sampler = PromptSampler(
        {"a": 6}, {"a": 1.0}, DifficultyConfig(easy_fraction=0.0, hard_fraction=0.0), seed=1
    )
    epochs = [[sampler.sample()[1] for _ in range(6)] for _ in range(4)]
    assert all(sorted(epoch) == list(range(6)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1


def rollout(reward: float, n: int = 3, error: str | None = None, version: int = 0) -> Rollout:
    turn = Turn(
        prompt_token_ids=[1, 2],
        completion_token_ids=[3] * n,
        completion_logprobs=[-0.1] * n,
        policy_version_start=version,
        policy_version_end=version,
    )
    return Rollout(env_id="e", turns=[turn], reward=reward, error=error)


def test_group_processor_advantages_errors_and_zero_signal(tmp_path: Path) -> None:
    proc = GroupProcessor(advantage="drgrpo", drop_zero_advantage=True, solve_threshold=1.0)
    group = Group(prompt=Prompt(0, "e", 0, 0), start_version=0)
    group.rollouts = [rollout(1.0), rollout(0.0), rollout(0.5, error="reward function raised")]
    proc(group)
    assert [s.advantage for s in group.samples] == [0.5, -0.5]
    assert group.tokens == 6
    flat = Group(prompt=Prompt(1, "e", 1, 0), start_version=0)
    flat.rollouts = [rollout(1.0), rollout(1.0)]
    proc(flat)
    assert flat.samples == [] and flat.tokens == 0
    stats = proc.take_stats()
    assert stats.errored == 1 and stats.zero_advantage_groups == 1
    assert stats.rewards["e"] == [1.0, 0.0, 1.0, 1.0]
    batch = make_batch(1, [group], version=0)
    back = read_batch(write_batch(batch, tmp_path))
    assert back.meta["group_uids"] == [0] and len(back.samples) == 2
    assert back.samples[0].loss_mask == [0, 0, 1, 1, 1]


def test_exploit_detectors_count_solved_rollouts_they_recognise(tmp_path: Path) -> None:
    """Only solved rollouts are checked; a raising detector is counted apart, not fatal."""

    def touched_runner(r: Rollout) -> bool:
        return r.info.get("edited") == "pytest.py"

    def broken(r: Rollout) -> bool:
        raise RuntimeError("detector bug")

    detectors = {
        "e": [
            Exploit("runner shadowing", lambda env, row: {}, detect=touched_runner),
            Exploit("broken", lambda env, row: {}, detect=broken),
            Exploit("no detector", lambda env, row: {}),
        ]
    }
    proc = GroupProcessor(
        advantage="grpo", drop_zero_advantage=False, solve_threshold=1.0, detectors=detectors
    )
    group = Group(prompt=Prompt(0, "e", 0, 0), start_version=0)
    group.rollouts = [rollout(1.0), rollout(1.0), rollout(0.0)]
    group.rollouts[0].info = {"edited": "pytest.py"}
    group.rollouts[2].info = {"edited": "pytest.py"}  # unsolved: not counted
    proc(group)
    record = step_record(
        1,
        make_batch(1, [group], version=0),
        proc.take_stats(),
        Counters(launched=3, finished=3),
        rollout_time_s=1.0,
        train_time_s=1.0,
        step_time_s=2.0,
        idle_s=0.0,
        weights_wait_s=0.0,
        weight_update_s=0.0,
    )
    assert record["exploit_flagged/e/runner shadowing"] == 1
    assert record["exploit_flagged/e/broken!error"] == 2
    assert record["exploit_flagged"] == 1


def test_metrics_record_log_and_plot(tmp_path: Path) -> None:
    proc = GroupProcessor(advantage="grpo", drop_zero_advantage=True, solve_threshold=1.0)
    group = Group(prompt=Prompt(0, "e", 0, 0), start_version=0)
    group.rollouts = [rollout(1.0, version=0), rollout(0.0, n=5, version=1)]
    for r, task in zip(group.rollouts, ["sudoku", "countdown"], strict=True):
        r.info = {"task": task}  # environments with named tasks get a reward curve per task
        r.metrics = {"correct": r.reward, "format": 1.0}  # each reward function's score
    proc(group)
    batch = make_batch(1, [group], version=1)
    record = step_record(
        1,
        batch,
        proc.take_stats(),
        Counters(launched=2, finished=2),
        rollout_time_s=2.0,
        train_time_s=1.0,
        step_time_s=3.0,
        idle_s=1.5,
        weights_wait_s=0.8,
        weight_update_s=0.2,
    )
    assert record["reward_mean/e"] == 0.5 and record["solve_rate/e"] == 0.5
    assert record["reward_mean/e/sudoku"] == 1.0 and record["reward_mean/e/countdown"] == 0.0
    assert record["staleness_hist/0"] == 1 and record["staleness_hist/1"] == 1
    assert record["inference_idle_frac"] == 0.5
    assert record["weights_wait_s"] == 0.8 and record["weight_update_s"] == 0.2
    assert record["completion_len_mean"] == 4.0 and record["completion_len_max"] == 5
    assert record["reward_fn_mean/e/correct"] == 0.5 and record["reward_fn_mean/e/format"] == 1.0
    from rich.console import Console

    out = Console(file=open(tmp_path / "out.txt", "w"))
    logger = MetricsLogger(tmp_path, out, plot=True, plot_every_s=3600)
    for step in (1, 2):
        logger.log({**record, "step": step, "mismatch_kl": 1e-3, "icepop_masked_low_frac": 0.01})
        if step == 1:  # drawn after the first step, then not again within the hour
            first = (tmp_path / "metrics.png").stat().st_mtime_ns
    assert (tmp_path / "metrics.png").stat().st_mtime_ns == first
    logger.draw_plot()  # the end of the run draws the last steps
    assert (tmp_path / "metrics.png").stat().st_mtime_ns > first
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    truncate_jsonl(tmp_path / "metrics.jsonl", 1)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_resume_rolls_back_to_trainer_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / ".metadata").write_text("")
    (run / "checkpoints" / "latest").write_text("step_000002")
    for step in (1, 2, 3):
        (run / "weights" / f"step_{step:06d}").mkdir(parents=True)
        (run / "weights" / f"step_{step:06d}" / "STABLE").write_text("")
        save_state(run, step, {"sampler": {"marker": step}})
        (run / "batches").mkdir(exist_ok=True)
        (run / "batches" / f"step_{step:06d}.pt").write_text("x")
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step}) + "\n")
    with pytest.raises(UsageError, match="--resume"):
        check_fresh_run_dir(run)
    step, state = prepare_resume(run)
    assert step == 2 and state is not None and state["sampler"] == {"marker": 2}
    assert sorted(p.name for p in (run / "batches").iterdir()) == [
        "step_000001.pt",
        "step_000002.pt",
    ]
    assert not (run / "weights" / "step_000003").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


async def test_the_state_of_a_step_is_saved_before_its_batch_reaches_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILL can land right after the batch is written, after the trainer has trained and
    checkpointed it: the step's orchestrator state must exist by then, or `--resume` refuses
    the run (a newcomer suite's LoRA kill-resume test once found a checkpoint at step 4 without
    `orchestrator/step_000004.json`)."""
    from types import SimpleNamespace

    from rlkit.orchestrator import loop
    from rlkit.protocol.layout import RunLayout

    run = tmp_path / "run"
    seen: list[bool] = []

    class Killed(Exception):
        pass

    def write_batch(batch: object, run_dir: Path) -> None:
        seen.append(RunLayout(run_dir).orchestrator_state(3).exists())
        raise Killed  # the process dies as the trainer gets the batch

    async def next_batch() -> list[str]:
        return ["a group"]

    async def settled() -> None:
        return None

    sampler = SimpleNamespace(state_dict=lambda: {"marker": 3})
    orchestrator = loop.Orchestrator.__new__(loop.Orchestrator)
    orchestrator.run_dir = run
    orchestrator.scheduler = SimpleNamespace(next_batch=next_batch, version=2)
    orchestrator.prompts = SimpleNamespace(
        take_dropped=lambda: [], sampler=sampler, state_dict=lambda: {"owed": []}
    )
    orchestrator.settle_canary = settled
    monkeypatch.setattr(loop, "make_batch", lambda *args: "the batch")
    monkeypatch.setattr(loop, "write_batch", write_batch)
    with pytest.raises(Killed):
        await orchestrator.step(3)
    assert seen == [True]


def test_resume_recovers_the_line_of_a_checkpointed_step_the_orchestrator_never_logged(
    tmp_path: Path,
) -> None:
    """Interrupted after the trainer checkpointed step 2 but before the orchestrator logged it."""
    from rlkit.protocol.batch import TrainBatch, TrainSample, write_batch

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / ".metadata").write_text("")
    (run / "checkpoints" / "latest").write_text("step_000002")
    (run / "weights" / "step_000002").mkdir(parents=True)
    (run / "weights" / "step_000002" / "STABLE").write_text("")
    for step in (1, 2):
        save_state(run, step, {"sampler": {}})
        sample = TrainSample(
            token_ids=[1, 2], loss_mask=[0, 1], inference_logprobs=[0.0, -0.5], advantage=0.5,
            policy_version=step - 1, env_id="reverse-text", reward=0.25 * step,
        )  # fmt: skip
        write_batch(TrainBatch(step=step, samples=[sample] * 2, meta={"tokens": 4}), run)
        with open(run / "trainer_metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "grad_norm": float(step)}) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.25}) + "\n")

    step, _ = prepare_resume(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert step == 2 and [r["step"] for r in records] == [1, 2]
    assert records[1]["recovered"] is True and records[1]["grad_norm"] == 2.0
    assert records[1]["reward_mean/reverse-text"] == 0.5 and records[1]["batch_samples"] == 2


def test_dry_run_prints_resolved_config(tmp_path: Path) -> None:
    import tomllib

    from rlkit_cli.main import app
    from typer.testing import CliRunner

    path = tmp_path / "train.toml"
    path.write_text(BASE)
    result = CliRunner().invoke(app, ["train", str(path), "--dry-run", "--loss.name", "grpo"])
    assert result.exit_code == 0, result.output
    resolved = tomllib.loads(result.stdout)
    assert resolved["loss"]["name"] == "grpo"
    assert resolved["orchestrator"]["scheduler"] == "c3po"
    assert not (tmp_path / "runs").exists()


def test_trainer_command_uses_torchrun_for_several_ranks(tmp_path: Path) -> None:
    from rlkit.launch.launcher import trainer_command

    one = trainer_command(tmp_path / "t.toml", 1, resume=False)
    assert one[1:3] == ["-m", "rlkit.trainer.main"] and "--resume" not in one
    two = trainer_command(tmp_path / "t.toml", 2, resume=True)
    assert two[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    assert two[-1] == "--resume"
