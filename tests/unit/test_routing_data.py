"""R3 routing data: rollout record -> training sample -> batch file -> trainer sequence, and the
engine-side per-request capture store."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from rlkit.envs.rollout import Rollout, Turn
from rlkit.inference.routing_capture import RequestRouting
from rlkit.orchestrator.batching import routing_fields
from rlkit.protocol.batch import (
    MalformedBatchError,
    TrainBatch,
    TrainSample,
    read_batch,
    write_batch,
)
from rlkit.trainer.rl import to_sequences


def b64(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def test_the_last_turns_routing_covers_the_sample_and_survives_the_batch_file(
    tmp_path: Path,
) -> None:
    first = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 0]]], dtype=np.uint8)
    # turn 2 saw turn 1's prompt (2) + completion (1) + reply (1) as its prompt: 4 tokens, then
    # sampled 2; the engine returns routing for 4 + 2 - 1 = 5 positions
    second = (np.arange(5 * 2 * 2).reshape(5, 2, 2) % 4).astype(np.uint8)
    rollout = Rollout(
        turns=[
            Turn(
                prompt_token_ids=[1, 2],
                completion_token_ids=[3],
                completion_logprobs=[-0.5],
                routed_experts=b64(first),
            ),
            Turn(
                prompt_token_ids=[1, 2, 3, 4],
                completion_token_ids=[5, 6],
                completion_logprobs=[-0.1, -0.2],
                routed_experts=b64(second),
            ),
        ]
    )
    rollout = Rollout.model_validate_json(rollout.model_dump_json())  # the JSON record
    sample = rollout.training_sample()
    assert sample.token_ids == [1, 2, 3, 4, 5, 6]
    assert sample.routing.shape == (6, 2, 2)
    np.testing.assert_array_equal(sample.routing[:5], second)
    assert (sample.routing[5] == -1).all()  # the last sampled token was never forwarded

    train = TrainSample(
        token_ids=sample.token_ids,
        loss_mask=sample.loss_mask,
        inference_logprobs=sample.inference_logprobs,
        advantage=1.0,
        policy_version=0,
        **routing_fields(sample),
    )
    write_batch(TrainBatch(step=1, samples=[train]), tmp_path)
    (seq,) = to_sequences(read_batch(tmp_path / "batches" / "step_000001.pt"))
    assert seq.routing.dtype == torch.long
    torch.testing.assert_close(seq.routing, torch.from_numpy(sample.routing.astype(np.int64)))


def test_samples_without_routing_stay_without() -> None:
    rollout = Rollout(
        turns=[Turn(prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[-1.0])]
    )
    sample = rollout.training_sample()
    assert sample.routing is None and routing_fields(sample) == {}


def test_routing_of_the_wrong_size_is_a_malformed_batch(tmp_path: Path) -> None:
    bad = TrainSample(
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        inference_logprobs=[0.0, -1.0, -1.0],
        advantage=1.0,
        policy_version=0,
        routing=b"\x00" * 10,
        routing_dims=(2, 2),
    )
    write_batch(TrainBatch(step=1, samples=[bad]), tmp_path)
    with pytest.raises(MalformedBatchError, match=r"sample 0: routing has 10 bytes"):
        read_batch(tmp_path / "batches" / "step_000001.pt")


def test_capture_store_writes_rows_by_position() -> None:
    record = RequestRouting(layers=2, top_k=2)
    record.write(0, 0, np.array([[0, 1]] * 50, dtype=np.int16))  # prefill chunk, layer 0
    record.write(0, 1, np.array([[2, 3]] * 50, dtype=np.int16))
    record.write(50, 0, np.array([[1, 2]] * 30, dtype=np.int16))  # second chunk grows the store
    record.write(50, 1, np.array([[3, 0]] * 30, dtype=np.int16))
    record.write(80, 0, np.array([[3, 1]], dtype=np.int16))  # one decode step
    out = record.array()
    assert out.shape == (81, 2, 2) and out.dtype == np.int16
    assert out[49].tolist() == [[0, 1], [2, 3]]
    assert out[79].tolist() == [[1, 2], [3, 0]]
    assert out[80].tolist() == [[3, 1], [-1, -1]]  # layer 1 not yet written stays unknown
