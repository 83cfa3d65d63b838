"""`rlkit runs audit`: passes on an intact run directory, fails on tampered ones, exit 2 on a
bad path. The run directories are written by the orchestrator's own pieces (prompt stream,
`make_batch`, `write_batch`, `save_state`) without servers or a trainer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlkit.orchestrator.batching import make_batch
from rlkit.orchestrator.config import DifficultyConfig
from rlkit.orchestrator.prompts import PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import Group
from rlkit.orchestrator.state import save_state
from rlkit.protocol.batch import TrainSample, write_batch
from rlkit.runs.audit import audit_run
from tests.helpers.cli import run_cli


def write_run(run: Path, steps: int = 4) -> None:
    """Each step hands out 3 prompts and trains 2; one is dropped at step 2, the third of
    every step waits in the pool until the next (owed at the end)."""
    sampler = PromptSampler({"a": 5, "b": 4}, {"a": 1.0, "b": 1.0}, DifficultyConfig())
    stream = PromptStream(sampler)
    pool: list = []
    for step in range(1, steps + 1):
        pool += [stream.take() for _ in range(3)]
        if step == 2:
            stream.drop(pool.pop(), "no_samples")
        groups = []
        for prompt in pool[:2]:
            group = Group(prompt=prompt, start_version=step - 1)
            group.samples = [
                TrainSample(
                    token_ids=[1, 2],
                    loss_mask=[0, 1],
                    inference_logprobs=[0.0, -0.5],
                    advantage=0.5,
                    policy_version=step - 1,
                    env_id=prompt.env_id,
                    example_id=prompt.index,
                )  # fmt: skip
            ] * 2
            group.tokens = 2
            groups.append(group)
            stream.trained(prompt)
        pool = pool[2:]
        write_batch(make_batch(step, groups, step - 1, stream.take_dropped()), run)
        save_state(run, step, {"sampler": sampler.state_dict(), "prompts": stream.state_dict()})
        for name in ("metrics.jsonl", "trainer_metrics.jsonl"):
            with open(run / name, "a") as f:
                f.write(json.dumps({"step": step}) + "\n")


def test_an_intact_run_passes(tmp_path: Path, monkeypatch, capsys) -> None:
    write_run(tmp_path / "run")
    report = audit_run(tmp_path / "run")
    assert report.ok, report.violations
    assert (report.draws, report.trained, report.dropped, report.owed) == (12, 8, 1, 3)
    assert sum(c.trained for c in report.epochs.values()) == 8
    code, out = run_cli(monkeypatch, capsys, "runs", "audit", str(tmp_path / "run"))
    assert code in (0, None), out
    assert "12 handed out; 8 trained, 1 dropped, 3 owed at step 4" in out and "OK:" in out


def test_a_duplicated_batch_fails(tmp_path: Path, monkeypatch, capsys) -> None:
    run = tmp_path / "run"
    write_run(run)
    shutil.copy(run / "batches" / "step_000002.pt", run / "batches" / "step_000003.pt")
    report = audit_run(run)
    text = "\n".join(report.violations)
    assert "step_000003.pt holds the batch of step 2" in text
    assert "trained in step 2; trained in step 3" in text
    assert "prompts handed out but never trained or dropped" in text  # step 3's lost prompts
    code, out = run_cli(monkeypatch, capsys, "runs", "audit", str(run))
    assert code == 1 and "VIOLATION" in out


def test_a_dropped_metrics_line_fails(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    assert audit_run(run).violations == ["metrics.jsonl: steps missing: 2"]
    with open(run / "trainer_metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4}) + "\n")
    assert "trainer_metrics.jsonl: steps logged more than once: 4" in audit_run(run).violations


def test_an_example_trained_twice_in_one_epoch_fails(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, steps=6)  # 18 draws over 9 examples: epoch 1 of each environment begins
    assert audit_run(run).ok
    import torch

    path = run / "batches" / "step_000005.pt"
    raw = torch.load(path, weights_only=True)
    first = torch.load(run / "batches" / "step_000001.pt", weights_only=True)["meta"]["prompts"]
    raw["meta"]["prompts"][0] = {**raw["meta"]["prompts"][0], **first[0]}
    torch.save(raw, path)
    text = "\n".join(audit_run(run).violations)
    assert f"{first[0]['env_id']} example {first[0]['index']} trained 2 times in epoch 0" in text


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_a_bad_path_exits_2(tmp_path: Path, monkeypatch, capsys, make: str) -> None:
    path = tmp_path / "nope"
    if make == "empty":
        path.mkdir()
    code, out = run_cli(monkeypatch, capsys, "runs", "audit", str(path))
    assert code == 2 and "RUN_DIR" in out
