"""reverse-text: deterministic data, the reversal reward, dataset loading and a scored rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reverse_text import load_environment, prefix_similarity, reversal_score, sft_examples

from rlkit.envs import load_environment as load_by_id
from rlkit.envs.check import check_environment
from rlkit.errors import UsageError
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer


def test_generated_data_is_deterministic_and_bounded() -> None:
    env = load_environment(num_train_examples=50, num_eval_examples=20, min_len=3, max_len=6)
    again = load_environment(num_train_examples=50, num_eval_examples=20, min_len=3, max_len=6)
    train, evaluation = env.get_dataset(), env.get_eval_dataset()
    assert train["question"] == again.get_dataset()["question"]
    assert len(train) == 50 and len(evaluation) == 20
    assert all(3 <= len(q) <= 6 and set(q) <= set("abcdefghij") for q in train["question"])
    assert all(a == q[::-1] for q, a in zip(train["question"], train["answer"], strict=True))
    assert not set(train["question"]) & set(evaluation["question"])
    other_seed = load_environment(num_train_examples=50, num_eval_examples=20, seed=1)
    assert other_seed.get_dataset()["question"] != train["question"]
    assert train[0]["prompt"][0]["role"] == "system" and train[0]["prompt"][1]["role"] == "user"


def test_prefix_similarity_and_reversal_score() -> None:
    assert prefix_similarity("cba", "cba") == 1.0
    assert prefix_similarity("", "cba") == 0.0
    assert prefix_similarity("cbx", "cba") == 2 / 3
    assert prefix_similarity("cxa", "cba") == 1 / 3  # nothing after the first mistake counts
    assert prefix_similarity("cbaa", "cba") == 3 / 4  # an extra char costs its position
    assert reversal_score("cba", "cba") == 1.0
    assert reversal_score("", "cba") == 0.0
    # abc -> cba: "c" repeated (a cheap answer) gets the first character, so b = 1/3
    assert reversal_score("cbx", "cba") == 0.5
    assert reversal_score("abc", "cba") == 0.0
    assert reversal_score("cxa", "cba") == 0.0


def test_hedging_earns_no_more_than_a_wrong_guess() -> None:
    # unsure of the middle order, a policy may write one character twice: per-position credit
    # paid that above a wrong guess (and RL learned it); prefix credit pays them the same
    target = "QXGJKB"
    wrong_guess, hedge, right = "QXGKJB", "QXGKKB", target
    assert reversal_score(hedge, target) == reversal_score(wrong_guess, target)
    assert reversal_score(hedge, target) < reversal_score(right, target) == 1.0


def test_bad_lengths_are_rejected() -> None:
    with pytest.raises(UsageError, match="min_len <= max_len"):
        load_by_id("reverse-text", min_len=9, max_len=3)


def test_sft_examples_are_correct_chat_rows() -> None:
    rows = sft_examples(5, seed=3)
    assert len(rows) == 5 and rows == sft_examples(5, seed=3)
    for row in rows:
        text = row["prompt"][-1]["content"]
        assert row["completion"] == [{"role": "assistant", "content": text[::-1]}]


def test_dataset_name_loads_a_local_file(tmp_path: Path) -> None:
    path = tmp_path / "texts.jsonl"
    texts = ["hello world", "rlkit", "abc", "xyz"]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    env = load_by_id("reverse-text", dataset_name=str(path), num_eval_examples=1)
    assert env.get_eval_dataset()["question"] == ["hello world"]
    assert env.get_dataset()["answer"] == ["tiklr", "cba", "zyx"]
    folder = tmp_path / "texts-dataset"  # a dataset folder, as a hub download would be
    folder.mkdir()
    (folder / "train.jsonl").write_text(path.read_text())
    from_folder = load_by_id("reverse-text", dataset_name=str(folder), num_eval_examples=2)
    assert from_folder.get_dataset()["question"] == ["abc", "xyz"]
    with pytest.raises(UsageError, match="no column 'body'"):
        load_by_id("reverse-text", dataset_name=str(path), text_column="body")
    with pytest.raises(UsageError, match="could not load dataset"):
        load_by_id("reverse-text", dataset_name=str(tmp_path / "missing-dir-or-name"))


async def test_rollouts_are_scored_by_reversal() -> None:
    env = load_by_id("reverse-text", num_train_examples=4, num_eval_examples=2)
    row = env.get_eval_dataset()[0]

    def think_then_reverse(body: dict) -> str:
        return "<think>\nflip it\n</think>\n" + body["messages"][-1]["content"][::-1]

    with FakeOpenAIServer(responder=think_then_reverse) as server:
        async with InferenceClient(server.url) as client:
            good = await env.run_group(row, client, "fake-model", {}, n=2)
        assert server.requests[0]["max_tokens"] == 64  # the environment's sampling default
    with FakeOpenAIServer(responder=lambda body: "<think>unfinished") as server:
        async with InferenceClient(server.url) as client:
            (bad,) = await env.run_group(row, client, "fake-model", {}, n=1)
    assert [r.reward for r in good] == [1.0, 1.0] and good[0].metrics == {
        "reversal_reward": 1.0,
        "exact_match": 1.0,
    }
    assert bad.reward == 0.0 and bad.error is None


def test_reversed_text_is_gold() -> None:
    env = load_by_id("reverse-text", num_train_examples=10, num_eval_examples=10)
    report = check_environment(env, num_rows=10, gold=True)
    assert report.ok and report.summary()["gold"] == (10, 10)
