"""The orchestrator -> trainer batch file (`rlkit.protocol.batch`): atomic write, round trip,
clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.protocol.batch import (
    MalformedBatchError,
    TrainBatch,
    TrainSample,
    read_batch,
    read_batch_header,
    write_batch,
)
from rlkit.protocol.layout import RunLayout


def sample(**changes) -> TrainSample:
    base = dict(
        token_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        inference_logprobs=[0.0, 0.0, -1.5, -0.25],
        advantage=0.5,
        policy_version=3,
        env_id="reverse-text",
        reward=1.0,
    )
    return TrainSample(**{**base, **changes})


def test_round_trip_and_path(tmp_path: Path) -> None:
    batch = TrainBatch(step=7, samples=[sample(), sample(advantage=-1.0)], meta={"x": 1})
    path = write_batch(batch, tmp_path)
    assert path == tmp_path / "batches" / "step_000007.pt" == RunLayout(tmp_path).batch(7)
    assert [p.name for p in path.parent.iterdir()] == ["step_000007.pt"]  # no tmp file left
    assert read_batch(path) == batch
    assert batch.num_tokens == 8


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(loss_mask=[0, 1, 1]), "sample 1: loss_mask has 3 entries, token_ids has 4"),
        (dict(inference_logprobs=[0.0]), "sample 1: inference_logprobs has 1 entries"),
        (dict(loss_mask=[0, 0, 2, 1]), "sample 1: loss_mask must contain only 0 and 1"),
        (dict(loss_mask=[1, 0, 1, 1]), "sample 1: loss_mask[0] is 1"),
        (dict(inference_logprobs=[0.0, 0.0, float("nan"), 0.0]), "sample 1: inference_logprobs"),
        (dict(advantage=float("inf")), "sample 1: advantage is inf"),
        (dict(token_ids=[1, -2, 3, 4]), "sample 1: token_ids contains a negative id"),
        (dict(token_ids=[1], loss_mask=[0], inference_logprobs=[0.0]), "need at least 2"),
    ],
)
def test_malformed_sample_named(tmp_path: Path, changes: dict, message: str) -> None:
    path = write_batch(TrainBatch(step=1, samples=[sample(), sample(**changes)]), tmp_path)
    with pytest.raises(MalformedBatchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_batch(path)


def test_missing_field_and_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "step_000001.pt"
    bad = TrainBatch(step=1, samples=[sample()]).model_dump()
    del bad["samples"][0]["advantage"]
    torch.save(bad, path)
    with pytest.raises(MalformedBatchError, match="advantage"):
        read_batch(path)
    path.write_bytes(b"not a torch file")
    with pytest.raises(MalformedBatchError, match="cannot load batch"):
        read_batch(path)
    torch.save({"step": 1, "samples": [], "meta": {}}, path)
    with pytest.raises(MalformedBatchError, match="no samples"):
        read_batch(path)


def test_samples_are_stored_as_columns(tmp_path: Path) -> None:
    """One tensor per field on disk (fast under weights_only), samples of different lengths."""
    short = sample(token_ids=[5, 6], loss_mask=[0, 1], inference_logprobs=[0.0, -0.125])
    batch = TrainBatch(
        step=1, samples=[sample(), short, sample(routing=bytes(8), routing_dims=(1, 1))]
    )
    raw = torch.load(write_batch(batch, tmp_path), weights_only=True)
    columns = raw["columns"]
    assert columns["token_ids"].tolist() == [5, 6, 7, 8, 5, 6, 5, 6, 7, 8]
    assert columns["lengths"]["loss_mask"].tolist() == [4, 2, 4]
    assert columns["advantage"].dtype == torch.float64
    assert columns["routing"] == [None, None, bytes(8)]
    assert read_batch(RunLayout(tmp_path).batch(1)) == batch


def test_batch_written_as_plain_fields_still_reads(tmp_path: Path) -> None:
    """A run resumed across the switch to columns reads its earlier batches."""
    batch = TrainBatch(step=2, samples=[sample(), sample(advantage=-1.0)])
    path = RunLayout(tmp_path).batch(2)
    path.parent.mkdir()
    torch.save(batch.model_dump(), path)
    assert read_batch(path) == batch


def test_missing_column_named(tmp_path: Path) -> None:
    path = write_batch(TrainBatch(step=1, samples=[sample()]), tmp_path)
    raw = torch.load(path, weights_only=True)
    del raw["columns"]["inference_logprobs"]
    torch.save(raw, path)
    with pytest.raises(MalformedBatchError, match="no column 'inference_logprobs'"):
        read_batch(path)


def test_header_is_read_without_the_samples(tmp_path: Path) -> None:
    batch = TrainBatch(step=4, samples=[sample(), sample()], meta={"prompts": [{"draw": 0}]})
    header = read_batch_header(write_batch(batch, tmp_path))
    assert header == (4, {"prompts": [{"draw": 0}]}, 2)
