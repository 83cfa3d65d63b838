"""Rollout records: JSON round trip, policy versions and training samples with masks."""

from __future__ import annotations

import json

import pytest

from rlkit.envs import Rollout, Turn


def _turn(prompt: list[int], completion: list[int], version: int = 0) -> Turn:
    return Turn(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.1 * (i + 1) for i in range(len(completion))],
        finish_reason="stop",
        policy_version_start=version,
        policy_version_end=version + 1,
    )


def test_single_turn_training_sample() -> None:
    rollout = Rollout(turns=[_turn([1, 2, 3], [4, 5])])
    sample = rollout.training_sample()
    tokens, mask, logprobs = sample.token_ids, sample.loss_mask, sample.inference_logprobs
    assert tokens == [1, 2, 3, 4, 5]
    assert mask == [0, 0, 0, 1, 1]
    assert logprobs == [0.0, 0.0, 0.0, pytest.approx(-0.1), pytest.approx(-0.2)]


def test_multi_turn_sample_masks_environment_tokens() -> None:
    # turn 2's prompt extends turn 1's prompt + completion with environment tokens 6, 7
    rollout = Rollout(turns=[_turn([1, 2], [3, 4]), _turn([1, 2, 3, 4, 6, 7], [8], version=2)])
    sample = rollout.training_sample()
    tokens, mask, logprobs = sample.token_ids, sample.loss_mask, sample.inference_logprobs
    assert tokens == [1, 2, 3, 4, 6, 7, 8]
    assert mask == [0, 0, 1, 1, 0, 0, 1]
    assert logprobs[-1] == pytest.approx(-0.1)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    assert rollout.policy_versions == [0, 1, 2, 3]


def test_broken_prefix_falls_back_to_the_last_turns_context() -> None:
    # the template re-tokenised turn 1's completion [3, 4] as [9]: keep the common prefix [1, 2]
    rollout = Rollout(turns=[_turn([1, 2], [3, 4]), _turn([1, 2, 9, 6], [8])])
    sample = rollout.training_sample()
    tokens, mask = sample.token_ids, sample.loss_mask
    assert tokens == [1, 2, 9, 6, 8]
    assert mask == [0, 0, 0, 0, 1]


def test_logprob_count_mismatch_is_an_error() -> None:
    bad = Turn(prompt_token_ids=[1], completion_token_ids=[2, 3], completion_logprobs=[-1.0])
    with pytest.raises(ValueError, match="2 completion tokens but 1 logprobs"):
        Rollout(turns=[bad]).training_sample()


def test_json_round_trip_drops_state() -> None:
    rollout = Rollout(
        env_id="e",
        example_id=3,
        prompt=[{"role": "user", "content": "hi"}],
        completion=[{"role": "assistant", "content": "yo"}],
        turns=[_turn([1], [2])],
        reward=0.5,
        metrics={"f": 0.5},
        state={"not_json": object()},
    )
    data = json.loads(json.dumps(rollout.model_dump()))
    assert "state" not in data
    again = Rollout(**data)
    assert again.turns == rollout.turns and again.reward == 0.5 and again.example_id == 3
