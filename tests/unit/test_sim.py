"""rlkit.sim: the virtual clock, the simulated servers, and the real schedulers driving them."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.orchestrator.config import RolloutJobConfig
from rlkit.orchestrator.scheduler import scheduler_class
from rlkit.runs.audit import audit_run
from rlkit.sim.clock import SimulationStalled, run_virtual
from rlkit.sim.compare import compare, sweep
from rlkit.sim.config import SimConfig
from rlkit.sim.engine import GroupWait, Request, SimPool
from rlkit.sim.workload import read_trace
from tests.helpers.cli import run_cli


def small(**sim: object) -> tuple[RolloutJobConfig, SimConfig]:
    """A few servers, short completions with a tail: each scheduler runs in well under 1 s."""
    cfg = RolloutJobConfig.model_validate(
        {
            "env": [{"id": "a"}, {"id": "b", "weight": 2.0}],
            "orchestrator": {
                "max_steps": 6,
                "group_size": 4,
                "schedulers": {
                    "sync": {"batch_groups": 6},
                    "c3po": {
                        "capacity": 32,
                        "token_budget": 2000,
                        "retention": 1,
                    },
                },
                "max_off_policy_steps": 2,
                "sampling": {"max_tokens": 400},
            },
        }
    )
    defaults = {
        "servers": 4,
        "max_seqs": 8,
        "tick_base_s": 0.01,
        "tick_per_seq_s": 0.001,
        "update_s": 0.5,
        "train_base_s": 1.0,
        "train_per_token_s": 1e-4,
        "median": 60.0,
        "at_cap": 0.1,
        "token_unit": 4,
        "dataset_size": 1000,
    }
    return cfg, SimConfig(**{**defaults, **sim})


# ---- the virtual clock ---------------------------------------------------------------------


def test_virtual_clock_jumps_to_the_next_timer_without_sleeping() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen: list[float] = []

        async def at(delay: float) -> None:
            await asyncio.sleep(delay)
            seen.append(loop.time())

        await asyncio.gather(at(3600.0), at(60.0), at(86400.0 * 7))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100.0), 10.0)
        seen.append(loop.time())
        return seen

    t0 = time.perf_counter()
    assert run_virtual(main()) == [60.0, 3600.0, 604800.0, 604810.0]
    assert time.perf_counter() - t0 < 2.0  # a simulated week, not a real one


def test_virtual_clock_reports_a_stall_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()  # nothing will ever resolve it

    with pytest.raises(SimulationStalled):
        run_virtual(main())


def test_the_schedulers_idle_time_is_measured_on_the_virtual_clock() -> None:
    """`take_idle_s` reads the event loop's clock: under the virtual loop it counts simulated
    seconds (a real clock would count the microseconds the callbacks took)."""
    from rlkit.orchestrator.prompts import PromptStream
    from rlkit.orchestrator.sampler import PromptSampler
    from tests.helpers.fake_engine import FakeEngine, processor

    async def main() -> float:
        engine = FakeEngine(iter(lambda: 5, None), group_size=2)
        prompts = PromptStream(
            PromptSampler({"x": 100}, {"x": 1.0}, small()[0].orchestrator.difficulty)
        )
        sched = scheduler_class("sync")(
            engine, processor(), prompts=prompts, batch_groups=1, max_off_policy_steps=1
        )
        sched.take_idle_s()
        await asyncio.sleep(1000.0)  # nothing in flight: idle
        await sched.next_batch()
        return sched.take_idle_s()

    assert run_virtual(main()) == pytest.approx(1000.0)


# ---- the simulated servers -----------------------------------------------------------------


def run_requests(lengths: list[int], sim: SimConfig, update_at: float | None = None):
    """Submit one group of `lengths` to a one-server pool; (finish times, versions)."""

    async def main():
        loop = asyncio.get_running_loop()
        pool = SimPool(1, sim)
        wait = GroupWait(loop.create_future(), len(lengths))
        requests = [Request(n, wait) for n in lengths]
        done: dict[int, float] = {}
        for i, req in enumerate(requests):
            single = GroupWait(loop.create_future(), 1)
            req.group = single
            single.future.add_done_callback(lambda _, i=i: done.setdefault(i, loop.time()))
        pool.submit(requests)
        if update_at is not None:
            await asyncio.sleep(update_at)
            await pool.update_weights(1)
        while len(done) < len(requests):
            await asyncio.sleep(0.001)
        return [done[i] for i in range(len(requests))], [
            (r.start_version, r.end_version) for r in requests
        ]

    return run_virtual(main())


def test_a_server_decodes_its_running_sequences_together() -> None:
    sim = SimConfig(max_seqs=4, tick_base_s=0.01, tick_per_seq_s=0.0, prefill_per_token_s=0.0)
    finish, _ = run_requests([100, 50], sim)
    assert finish == pytest.approx([1.0, 0.5], abs=2e-3)
    # batching cost: with 2 running each decode step takes 0.01 + 2 * 0.005
    sim = sim.model_copy(update={"tick_per_seq_s": 0.005})
    finish, _ = run_requests([100, 50], sim)
    assert finish[1] == pytest.approx(50 * 0.02, abs=2e-3)
    assert finish[0] == pytest.approx(50 * 0.02 + 50 * 0.015, abs=2e-3)


def test_the_concurrency_limit_queues_and_prefill_pauses() -> None:
    sim = SimConfig(max_seqs=1, tick_base_s=0.01, tick_per_seq_s=0.0, prefill_per_token_s=0.0)
    finish, _ = run_requests([10, 10], sim)
    assert finish == pytest.approx([0.1, 0.2], abs=2e-3)
    sim = sim.model_copy(update={"prefill_per_token_s": 0.001, "prompt_tokens": 100})
    finish, _ = run_requests([10, 10], sim)
    assert finish == pytest.approx([0.2, 0.4], abs=2e-3)


def test_a_weight_update_pauses_and_the_request_ends_under_the_new_version() -> None:
    sim = SimConfig(max_seqs=2, tick_base_s=0.01, tick_per_seq_s=0.0, prefill_per_token_s=0.0)
    finish, versions = run_requests([100, 10], sim, update_at=0.5)
    assert finish[1] == pytest.approx(0.1, abs=2e-3)
    assert finish[0] == pytest.approx(1.0 + 5.0, abs=2e-3)  # paused for update_s = 5
    assert versions == [(0, 1), (0, 0)]


# ---- whole simulated runs ------------------------------------------------------------------


def test_same_seed_same_table_and_another_seed_another() -> None:
    cfg, sim = small()
    first = compare(cfg, sim, servers=4, seed=3)
    again = compare(cfg, sim, servers=4, seed=3)
    other = compare(cfg, sim, servers=4, seed=4)
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert first["schedulers"] != other["schedulers"]
    sync, c3po = first["schedulers"]["sync"], first["schedulers"]["c3po"]
    assert sync["speedup_step"] == 1.0 and sync["staleness"] == {"0": sync["prompts_trained"] * 4}
    assert c3po["speedup_rollout"] > 1.0  # the tail no longer sets the pace
    assert c3po["steps"] == sync["steps"] == 6


def test_losing_a_tenth_of_the_servers_loses_no_prompt_and_trains_none_twice(
    tmp_path: Path,
) -> None:
    cfg, sim = small(
        lose_fraction=0.1, lose_at_step=2, lose_after_s=0.3, rejoin_at_step=4, max_seqs=4
    )
    result = compare(cfg, sim, servers=20, seed=0, run_dir=tmp_path)
    for name in ("sync", "c3po"):
        report = audit_run(tmp_path / name)
        assert report.ok, report.violations
        assert (
            report.last_step == 6
            and report.trained == result["schedulers"][name]["prompts_trained"]
        )
    assert report.dropped > 0  # c3po purged some: dropped, and accounted for
    assert result["schedulers"]["c3po"]["prompts_purged"] == report.dropped
    # lost 0.3 s into step 2, mid-batch for both: their requests in flight moved
    assert all(result["schedulers"][name]["failovers"] > 0 for name in ("sync", "c3po"))


def test_losing_servers_sends_their_requests_to_the_others() -> None:
    sim = SimConfig(max_seqs=2, tick_base_s=0.01, tick_per_seq_s=0.0, prefill_per_token_s=0.0)

    async def main():
        loop = asyncio.get_running_loop()
        pool = SimPool(2, sim)
        wait = GroupWait(loop.create_future(), 2)
        pool.submit([Request(100, wait), Request(100, wait)])  # on server 0
        await asyncio.sleep(0.5)
        pool.lose([0])
        await wait.future
        return loop.time(), pool.failovers

    finished, failovers = run_virtual(main())
    assert failovers == 2 and finished == pytest.approx(0.5 + 1.0, abs=2e-3)  # restarted


def test_a_user_scheduler_named_by_module_path_runs_unmodified() -> None:
    cfg, sim = small(schedulers=["sync"])
    cfg.orchestrator.scheduler = "rlkit.orchestrator.scheduler:C3POScheduler"
    result = compare(cfg, sim, servers=4, seed=0)
    assert set(result["schedulers"]) == {"sync", "rlkit.orchestrator.scheduler:C3POScheduler"}


def test_the_sweep_names_a_setting_from_its_grid() -> None:
    cfg, sim = small(sweep_phi=[1.0, 2.0], sweep_omega=[1.0], sweep_sigma=[0, 2], sweep_steps=3)
    result = sweep(cfg, sim, servers=4, seed=0)
    assert len(result["rows"]) == 4
    assert result["best"] in result["rows"]
    assert result["best"]["trained_tokens_per_s"] == max(
        r["trained_tokens_per_s"] for r in result["rows"] if r["staleness_mean"] <= 2
    )


def test_a_trace_is_read_from_a_simulated_runs_batches(tmp_path: Path) -> None:
    cfg, sim = small(schedulers=["sync"])
    cfg.orchestrator.scheduler = "sync"
    compare(cfg, sim, servers=2, seed=0, steps=2, run_dir=tmp_path)
    lengths = read_trace(str(tmp_path / "sync"))
    assert len(lengths) == 2 * 6 * 4 and max(lengths) <= 400 // 4 + 1  # record tokens
    (tmp_path / "t.txt").write_text("10\n\n20\n")
    assert read_trace(str(tmp_path / "t.txt")) == [10, 20]


# ---- the command ---------------------------------------------------------------------------

CONFIG = """
[model]
path = "m"
[[env]]
id = "a"
[orchestrator]
max_steps = 4
group_size = 4
sampling = { max_tokens = 300 }
[orchestrator.schedulers.sync]
batch_groups = 4
[orchestrator.schedulers.c3po]
capacity = 16
token_budget = 1200
retention = 1
[simulate]
servers = 2
max_seqs = 8
tick_base_s = 0.01
median = 50.0
at_cap = 0.1
token_unit = 2
dataset_size = 500
"""


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "train.toml"
    path.write_text(CONFIG)
    return path


def test_simulate_prints_json_with_both_schedulers_and_a_plot(tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path)
    plot = tmp_path / "sim.png"
    code, out = run_cli(
        monkeypatch, capsys, "simulate", str(config), "--servers", "3", "--seed", "1", "--json",
        "--plot", str(plot),
    )  # fmt: skip
    assert code in (0, None), out
    result = json.loads(out)
    assert result["workload"]["servers"] == 3 and set(result["schedulers"]) == {"sync", "c3po"}
    assert result["schedulers"]["c3po"]["speedup_step"] > 0 and plot.stat().st_size > 10_000
    code, table = run_cli(monkeypatch, capsys, "simulate", str(config), "--seed", "1")
    assert code in (0, None) and "c3po" in table and "retention" in table


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--servers", "0"], "--servers"),
        (["--steps", "0"], "--steps"),
        (["--simulate.bogus", "1"], "simulate.bogus"),
        (["--simulate.lengths", "trace"], "simulate.trace"),
        (["--simulate.schedulers", '["sync", "no_such"]'], "simulate.schedulers"),
        (["--simulate.trace", "/nonexistent", "--simulate.lengths", "trace"], "simulate.trace"),
        (["--simulate.lose_fraction", "0.1"], "simulate.lose_at_step"),
    ],
)
def test_simulate_usage_errors_exit_2_naming_the_field(
    tmp_path, monkeypatch, capsys, args, names
) -> None:
    code, out = run_cli(monkeypatch, capsys, "simulate", str(write_config(tmp_path)), *args)
    assert code == 2 and names in out, out


def test_simulate_refuses_a_run_dir_that_holds_something(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.jsonl").write_text("{}\n")
    config = write_config(tmp_path)
    code, out = run_cli(
        monkeypatch, capsys, "simulate", str(config), "--run-dir", str(tmp_path / "old")
    )
    assert code == 2 and "--run-dir" in out


def test_the_shipped_example_simulates(monkeypatch, capsys):
    """examples/simulate/ring1t.toml as the README runs it (a few steps on a few servers): its
    64k completions and Phi, scaled to record tokens, still pass the config's own checks."""
    example = Path(__file__).resolve().parents[2] / "examples" / "simulate" / "ring1t.toml"
    code, out = run_cli(
        monkeypatch, capsys, "simulate", str(example), "--servers", "4", "--steps", "2", "--json"
    )
    assert code in (0, None), out
    result = json.loads(out)
    assert result["workload"]["length_cap"] == 65536
    assert all(row["step_s"] > 0 for row in result["schedulers"].values())


def test_through_the_cli_a_tenth_lost_and_rejoining_audits_clean_and_a_seed_repeats(
    tmp_path, monkeypatch, capsys
) -> None:
    """What a user runs: `rlkit simulate --run-dir` with 1 of 10 servers lost mid-step (a group
    on every server) and back two steps later, then `rlkit runs audit` on each scheduler's
    records; the same command again prints the same JSON to the character."""
    config = write_config(tmp_path)
    args = [
        "simulate", str(config), "--servers", "10", "--seed", "5", "--json", "--steps", "6",
        "--orchestrator.schedulers.sync.batch_groups", "10",
        "--orchestrator.schedulers.c3po.capacity", "40",
        "--simulate.lose_fraction", "0.1", "--simulate.lose_at_step", "2",
        "--simulate.lose_after_s", "0.2", "--simulate.rejoin_at_step", "4",
    ]  # fmt: skip
    code, first = run_cli(monkeypatch, capsys, *args, "--run-dir", str(tmp_path / "run"))
    assert code in (0, None), first
    result = json.loads(first)
    assert sum(row["failovers"] for row in result["schedulers"].values()) > 0
    for name in ("sync", "c3po"):
        code, out = run_cli(monkeypatch, capsys, "runs", "audit", str(tmp_path / "run" / name))
        trained = result["schedulers"][name]["prompts_trained"]
        assert code in (0, None) and "OK:" in out, out
        assert f"{trained} trained" in out and "at step 6" in out, out
    code, again = run_cli(monkeypatch, capsys, *args)
    assert code in (0, None) and again == first


def test_simulate_ends_with_a_recommendation_and_explains_its_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Issue 66 item 7: one plain recommendation line last; every column and drop reason said."""
    from rlkit.sim.compare import COLUMN_NOTES
    from tests.helpers.cli import DEMO_CONFIG, run_cli

    code, out = run_cli(monkeypatch, capsys, "simulate", str(DEMO_CONFIG), "--steps", "4")
    assert code in (0, None), out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("recommendation: ") and "orchestrator.scheduler" in lines[-1]
    assert "--seed" in lines[-1]
    for label in COLUMN_NOTES:
        assert any(line.startswith(f"{label}: ") for line in lines), label
    assert any(line.startswith("dropped no_samples: ") for line in lines), out


@pytest.mark.slow  # CLI processes
def test_simulate_takes_its_defaults_from_the_config_and_explains_every_figure(
    tmp_path: Path,
) -> None:
    """What a user runs on their own config: servers from inference.num_servers, sequences from
    vLLM's --max-num-seqs, the trainer's step time and weight update fitted to the config's own
    previous run (log.run_dir/metrics.jsonl), each with where it came from; a [simulate] field
    the user set wins; every table column and every drop reason is explained."""
    run = tmp_path / "previous"
    run.mkdir()
    rows = [
        {"step": i, "batch_tokens": t, "train_time_s": 2.0 + 0.001 * t, "weight_update_s": 1.5}
        for i, t in enumerate([400, 800, 1200, 1600], start=1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    own = CONFIG.replace("servers = 2\nmax_seqs = 8\n", "")
    own += (
        f'[inference]\nnum_servers = 3\nextra_args = ["--max-num-seqs", "24"]\n'
        f'[log]\nrun_dir = "{run}"\n'
    )
    config = tmp_path / "train.toml"
    config.write_text(own)
    cli = [sys.executable, "-c", "from rlkit_cli.main import main; main()", "simulate"]
    done = subprocess.run(
        [*cli, str(config), "--steps", "3", "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["workload"]["servers"] == 3 and result["workload"]["max_seqs"] == 24
    said = "\n".join(result["defaults"])
    assert "servers 3: inference.num_servers" in said
    assert "sequences per server 24: --max-num-seqs in inference.extra_args" in said
    assert "trainer step 2 s + 0.001 s/token: fitted to" in said and "(4 steps)" in said
    assert "weight update 1.5 s: the median weight_update_s" in said

    done = subprocess.run(
        [*cli, str(config), "--steps", "3", "--simulate.max_seqs", "8", "--servers", "2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "sequences per server 8: [simulate] max_seqs" in out and "servers 2: --servers" in out
    table_header = next(line for line in out.splitlines() if "scheduler" in line)
    columns = [c.strip() for c in re.split(r"[┃|]", table_header) if c.strip()]
    for column in columns[1:]:
        assert f"\n{column}: " in out, f"column {column!r} is not explained"
    dropped = re.findall(r"dropped \{([^}]*)\}", out)
    reasons = {r for d in dropped for r in re.findall(r"'(\w+)'", d)}
    for reason in reasons:
        assert f"dropped {reason}: " in out
    assert out.strip().splitlines()[-1].startswith("recommendation: ")
