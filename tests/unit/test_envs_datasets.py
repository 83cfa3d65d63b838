"""An environment's rows: checked on construction, formatted when first used."""

from __future__ import annotations

import pytest
from datasets import Dataset

from rlkit.envs import SingleTurnEnv


def rows(texts: list[str]) -> Dataset:
    return Dataset.from_dict({"question": texts, "answer": [t[::-1] for t in texts]})


def test_an_eval_formats_only_the_eval_rows() -> None:
    env = SingleTurnEnv(dataset=rows(["ab"] * 50), eval_dataset=rows(["cd"]), system_prompt="S")
    assert env.get_eval_dataset()[0]["prompt"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "cd"},
    ]
    assert "dataset" not in vars(env)  # the training rows were never formatted
    assert len(env.get_dataset()) == 50 and env.dataset[0]["answer"] == "ba"


def test_a_dataset_without_prompts_fails_on_construction() -> None:
    bad = Dataset.from_dict({"text": ["ab"]})
    with pytest.raises(ValueError, match="'prompt' or a 'question' column"):
        SingleTurnEnv(dataset=rows(["ab"]), eval_dataset=bad)
