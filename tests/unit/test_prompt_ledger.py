"""Exactly-once prompt accounting: what step k's state owes is handed out again after a resume,
in draw order, and orchestrator states live as long as the trainer's checkpoints need them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from rlkit.orchestrator.config import DifficultyConfig
from rlkit.orchestrator.prompts import Prompt, PromptStream
from rlkit.orchestrator.sampler import PromptSampler
from rlkit.orchestrator.scheduler import C3POScheduler
from rlkit.orchestrator.state import prepare_resume, rollback_line, save_state
from rlkit.protocol.layout import RunLayout
from tests.helpers.fake_engine import FakeEngine, processor


def sampler() -> PromptSampler:
    return PromptSampler({"a": 7, "b": 5}, {"a": 2.0, "b": 1.0}, DifficultyConfig(enabled=False))


def test_stream_hands_out_owed_prompts_first_in_draw_order() -> None:
    first = PromptStream(sampler())
    prompts = [first.take() for _ in range(6)]
    assert [p.draw for p in prompts] == list(range(6))
    first.trained(prompts[1])
    first.drop(prompts[3], "purged")
    assert first.take_dropped()[0]["draw"] == 3 and first.take_dropped() == []
    saved = json.loads(json.dumps({"sampler": first.sampler.state_dict(), **first.state_dict()}))
    assert [p["draw"] for p in saved["owed"]] == [0, 2, 4, 5]
    assert saved["next_draw"] == 6
    later = [first.take() for _ in range(3)]  # what the run drew after the save

    s = sampler()
    s.load_state_dict(saved["sampler"])
    resumed = PromptStream(s, saved)
    again = [resumed.take() for _ in range(7)]
    assert again[:4] == [prompts[i] for i in (0, 2, 4, 5)]  # same draws, same rows, same order
    assert again[4:] == later  # then the sampler's stream where it stood at the save
    assert resumed.state_dict()["owed"][-1]["draw"] == 8


async def test_c3po_resume_trains_every_prompt_exactly_once() -> None:
    """Crash after step 3 with groups in flight and in the pool; the resumed scheduler trains
    the uninterrupted run's prompts (multiset), none twice and none lost."""

    async def run(stream: PromptStream, steps: range, save_at: int = 0):
        engine = FakeEngine(itertools.repeat(10), group_size=2)  # 20 tokens a group
        sched = C3POScheduler(
            engine,
            processor(),
            prompts=stream,
            capacity=8,
            token_budget=50,  # 3 groups a step, 4 in flight: the pool keeps leftovers
            retention=100,
            max_off_policy_steps=100,
            version=steps.start - 1,
        )
        trained: dict[int, list[Prompt]] = {}
        saved = None
        try:
            for step in steps:
                trained[step] = [g.prompt for g in await sched.next_batch()]
                assert stream.take_dropped() == []
                if step == save_at:  # what the orchestrator saves with the batch
                    saved = {"sampler": stream.sampler.state_dict(), **stream.state_dict()}
                    saved = json.loads(json.dumps(saved))
                engine.version = step
                sched.on_policy_update(step)
        finally:
            await sched.close()
        return trained, saved, stream

    ref, _, _ = await run(PromptStream(sampler()), range(1, 9))
    crashed, saved, _ = await run(PromptStream(sampler()), range(1, 6), save_at=3)
    assert len(saved["owed"]) >= 2, "the crash point must leave prompts in flight or pooled"
    s = sampler()
    s.load_state_dict(saved["sampler"])
    resumed, _, stream = await run(PromptStream(s, saved), range(4, 9))
    combined = [p for step in (1, 2, 3) for p in crashed[step]]
    combined += [p for step in range(4, 9) for p in resumed[step]]
    draws = [p.draw for p in combined]
    assert len(set(draws)) == len(draws), "a prompt trained twice"
    # nothing lost: every draw below the stream's end is trained or still owed (none dropped)
    assert set(draws) | {p.draw for p in stream.owed()} == set(range(stream.next_draw))
    assert sorted(combined, key=lambda p: p.draw) == sorted(
        (p for ps in ref.values() for p in ps), key=lambda p: p.draw
    )


def checkpoint(run: Path, step: int) -> None:
    (run / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    (run / "checkpoints" / f"step_{step:06d}" / ".metadata").write_text("")
    (run / "checkpoints" / "latest").write_text(f"step_{step:06d}")
    (run / "weights" / f"step_{step:06d}").mkdir(parents=True)
    (run / "weights" / f"step_{step:06d}" / "STABLE").write_text("")


def test_states_are_kept_for_every_checkpoint_and_since_the_latest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = {"sampler": {}, "prompts": {"next_draw": 0, "owed": []}}
    save_state(run, 0, state)
    checkpoint(run, 2)
    for step in range(1, 10):  # 7 steps past the checkpoint: the old keep-5 lost step 2
        save_state(run, step, state)
    kept = sorted(p.name for p in (run / "orchestrator").iterdir())
    assert kept == [RunLayout(run).orchestrator_state(s).name for s in range(2, 10)]
    checkpoint(run, 6)
    save_state(run, 10, state)
    kept = sorted(p.name for p in (run / "orchestrator").iterdir())
    assert kept == [RunLayout(run).orchestrator_state(s).name for s in (2, 6, 7, 8, 9, 10)]
    assert prepare_resume(run)[0] == 6


def test_rollback_line_names_discarded_steps_and_owed_prompts(tmp_path: Path) -> None:
    from rlkit.protocol.batch import TrainBatch, TrainSample, write_batch

    run = tmp_path / "run"
    checkpoint(run, 2)
    sample = TrainSample(
        token_ids=[1, 2], loss_mask=[0, 1], inference_logprobs=[0.0, -0.5], advantage=0.5,
        policy_version=0,
    )  # fmt: skip
    for step in (1, 2, 3, 4):
        prompts = [{"draw": 2 * step + i} for i in range(2)]
        write_batch(TrainBatch(step=step, samples=[sample], meta={"prompts": prompts}), run)
    owed = [Prompt(d, "a", d, 0).__dict__ for d in (5, 6, 7)]
    state = {"step": 2, "prompts": {"next_draw": 8, "owed": owed}}
    line = rollback_line(run, 2, state)
    assert line == (
        "resume: rolled back to step 2's checkpoint, discarding steps 3-4 (2 batches, 4 prompts);"
        " regenerating from step 3: 3 prompts handed out but untrained at step 2 (draws 5..7),"
        " then the prompt stream from draw 8"
    )
    lines: list[str] = []
    for step in (1, 2, 3, 4):
        save_state(run, step, state)
    assert prepare_resume(run, report=lines.append)[0] == 2 and lines == [line]
    assert not (run / "batches" / "step_000003.pt").exists()
