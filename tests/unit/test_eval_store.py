"""Run storage: append + dedupe, crash-truncated lines, resume bookkeeping and refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.envs import Rollout
from rlkit.errors import UsageError
from rlkit.eval import EvalConfig, load_run
from rlkit.eval.runner import check_resumable
from rlkit.eval.store import EvalResult, RunMetadata, RunStore, pending_keys


def _result(i: int, j: int, error: str | None = None, reward: float = 1.0) -> EvalResult:
    rollout = Rollout(env_id="e", example_id=i, reward=reward, error=error)
    return EvalResult(i, j, rollout)


def _metadata(config: EvalConfig) -> RunMetadata:
    return RunMetadata(
        env_id=config.env_id,
        model=config.model,
        base_url=config.base_url,
        sampling={"max_tokens": 8},
        num_examples=config.num_examples,
        rollouts_per_example=config.rollouts_per_example,
        rlkit_version="0",
        config=config.model_dump(mode="json"),
    )


def test_pending_keys_lists_missing_and_errored_rollouts() -> None:
    results = [_result(0, 0), _result(0, 1, error="HTTP 500"), _result(1, 0), _result(1, 1)]
    assert pending_keys(results, num_examples=3, rollouts_per_example=2) == {0: [1], 2: [0, 1]}
    assert pending_keys(results[2:], num_examples=2, rollouts_per_example=2) == {0: [0, 1]}


def test_results_dedupe_last_wins_and_skip_truncated_line(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_metadata(_metadata(EvalConfig(env_id="e", model="m", num_examples=2)))
    store.append([_result(0, 0, error="timeout"), _result(1, 0)])
    store.append([_result(0, 0, reward=0.5)])  # the rerun of (0, 0)
    store.close()
    with store.results_path.open("a") as f:
        f.write('{"env_id": "e", "example_ind')  # a write cut short by a crash
    run = load_run(tmp_path)
    assert [r.key for r in run.results] == [(0, 0), (1, 0)]
    assert run.results[0].rollout.error is None
    assert run.results[0].rollout.reward == 0.5

    compacted = store.compact()
    lines = store.results_path.read_text().splitlines()
    assert len(lines) == 2 == len(compacted)
    assert not list(tmp_path.glob(".*.tmp"))


def test_result_line_is_rollout_dump_plus_indexes(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.append([_result(3, 1)])
    store.close()
    import json

    record = json.loads(store.results_path.read_text())
    assert record["example_index"] == 3 and record["rollout_index"] == 1
    assert Rollout.model_validate({k: v for k, v in record.items() if "index" not in k})


def test_load_run_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not an eval run directory"):
        load_run(tmp_path)


def test_resume_refuses_changed_configuration() -> None:
    config = EvalConfig(env_id="e", model="m", num_examples=2, rollouts_per_example=2)
    metadata = _metadata(config)
    plan = {"num_examples": 2, "sampling": {"max_tokens": 8}}
    check_resumable(config.model_copy(update={"max_concurrent": 7}), metadata, plan)  # allowed

    with pytest.raises(UsageError, match="temperature: run has None, now 0.7"):
        check_resumable(config.model_copy(update={"temperature": 0.7}), metadata, plan)
    with pytest.raises(UsageError, match="model: run has 'm', now 'other'"):
        check_resumable(config.model_copy(update={"model": "other"}), metadata, plan)
    with pytest.raises(UsageError, match="sampling: run has"):
        check_resumable(config, metadata, {**plan, "sampling": {"max_tokens": 9}})
