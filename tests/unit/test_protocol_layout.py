"""The run directory's layout (`rlkit.protocol.layout`): the names every process agrees on."""

from __future__ import annotations

from pathlib import Path

from rlkit.protocol.layout import RunLayout, step_name, step_of


def test_step_files_are_named_and_parsed_by_step(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path))  # a str works as well as a Path
    assert step_name(12) == "step_000012"
    assert layout.batch(12) == tmp_path / "batches" / "step_000012.pt"
    assert layout.weights_version(3) == tmp_path / "weights" / "step_000003"
    assert layout.checkpoint(3) == tmp_path / "checkpoints" / "step_000003"
    assert layout.orchestrator_state(4) == tmp_path / "orchestrator" / "step_000004.json"
    assert layout.eval_rollouts(5) == tmp_path / "eval" / "step_000005.jsonl"
    assert [step_of(p) for p in (layout.batch(12), layout.weights_version(3))] == [12, 3]


def test_listings_are_sorted_by_step_and_skip_what_is_not_a_step(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    for step in (10, 2, 1000000):  # the last one outgrows six digits: still sorted by number
        layout.weights_version(step).mkdir(parents=True)
        layout.batch(step).parent.mkdir(exist_ok=True)
        layout.batch(step).write_bytes(b"")
    (layout.weights / ".tmp_step_000011").mkdir()  # a version being written
    (layout.weights / "step_000012.partial").write_text("")  # a file, not a version
    assert [step_of(p) for p in layout.weights_versions()] == [2, 10, 1000000]
    assert [step_of(p) for p in layout.batch_files()] == [2, 10, 1000000]
    assert layout.checkpoint_dirs() == [] and layout.orchestrator_state_files() == []


def test_a_new_run_directory_is_private_and_an_existing_one_keeps_its_mode(
    tmp_path: Path,
) -> None:
    fresh = RunLayout(tmp_path / "runs" / "a").create()
    assert fresh == tmp_path / "runs" / "a" and fresh.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)
    assert RunLayout(shared).create().stat().st_mode & 0o777 == 0o750
