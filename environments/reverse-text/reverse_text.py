"""reverse-text: reverse a string character by character.

The answer is the plain text of the model's reply after any `<think>...</think>` reasoning
(ThinkParser), stripped of surrounding whitespace; the reward is difflib's SequenceMatcher ratio
(2 * matched characters / total characters) between that answer and the reversed text, so
partially right reversals earn partial credit. Data is generated offline and deterministically
from `seed`: random strings of `min_len`..`max_len` characters drawn from a small `alphabet`,
which a tiny model can learn in a short CPU run. With `dataset_name`, rows come from a hub
dataset, a local data file or a dataset folder instead (its `text_column` is reversed).
"""

from __future__ import annotations

import random
from difflib import SequenceMatcher
from typing import Any

from datasets import Dataset

from rlkit.envs import SingleTurnEnv, ThinkParser
from rlkit.envs.data import load_dataset_any
from rlkit.envs.rubric import Rubric

SYSTEM_PROMPT = "Reverse the text character by character. Reply with the reversed text only."
DEFAULT_ALPHABET = "abcdefghij"


def lcs_ratio(response: str, target: str) -> float:
    """Similarity in [0, 1]: 1.0 only for the exact reversal."""
    return SequenceMatcher(None, response, target, autojunk=False).ratio()


def generate_texts(
    n: int, seed: int, min_len: int, max_len: int, alphabet: str, exclude: set[str] | None = None
) -> list[str]:
    """n random strings (deterministic for a seed), none of them in `exclude`."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len} max_len={max_len}")
    if len(alphabet) < 2:
        raise ValueError(f"alphabet needs at least 2 characters, got {alphabet!r}")
    rng = random.Random(seed)
    exclude = exclude or set()
    texts: list[str] = []
    while len(texts) < n:
        text = "".join(rng.choices(alphabet, k=rng.randint(min_len, max_len)))
        if text not in exclude:
            texts.append(text)
    return texts


def _rows(texts: list[str]) -> Dataset:
    return Dataset.from_dict({"question": texts, "answer": [t[::-1] for t in texts]})


def sft_examples(
    n: int,
    seed: int = 0,
    min_len: int = 5,
    max_len: int = 10,
    alphabet: str = DEFAULT_ALPHABET,
    exclude: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Chat SFT rows: `prompt` (system + user messages) and the correct `completion`.

    Strings in `exclude` (e.g. the environment's train and eval texts) are never used.
    """
    return [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": text},
            ],
            "completion": [{"role": "assistant", "content": text[::-1]}],
        }
        for text in generate_texts(n, seed, min_len, max_len, alphabet, exclude)
    ]


class ReverseTextEnv(SingleTurnEnv):
    """Single-turn string reversal; the gold completion is the reversed text."""

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [{"role": "assistant", "content": row["answer"]}]


def load_environment(
    num_train_examples: int = 2000,
    num_eval_examples: int = 200,
    min_len: int = 5,
    max_len: int = 10,
    alphabet: str = DEFAULT_ALPHABET,
    seed: int = 0,
    dataset_name: str | None = None,
    dataset_split: str = "train",
    text_column: str = "text",
    system_prompt: str = SYSTEM_PROMPT,
) -> ReverseTextEnv:
    """Build the environment; eval strings never appear in the generated training set."""
    if dataset_name is not None:
        source = load_dataset_any(dataset_name, split=dataset_split)
        if text_column not in source.column_names:
            raise ValueError(
                f"dataset {dataset_name!r} has no column {text_column!r} "
                f"(columns: {source.column_names})"
            )
        texts = [str(t) for t in source[text_column]]
        eval_texts = texts[:num_eval_examples]
        train_texts = texts[num_eval_examples : num_eval_examples + num_train_examples]
    else:
        eval_texts = generate_texts(num_eval_examples, seed + 1, min_len, max_len, alphabet)
        train_texts = generate_texts(
            num_train_examples, seed, min_len, max_len, alphabet, exclude=set(eval_texts)
        )

    parser = ThinkParser()

    def lcs_reward(completion: list[dict[str, Any]], answer: str) -> float:
        return lcs_ratio(parser.parse_answer(completion) or "", answer)

    return ReverseTextEnv(
        dataset=_rows(train_texts) if train_texts else None,
        eval_dataset=_rows(eval_texts) if eval_texts else None,
        system_prompt=system_prompt,
        parser=parser,
        rubric=Rubric([lcs_reward], [1.0], parser=parser),
        sampling_defaults={"temperature": 1.0, "max_tokens": 64},
        env_id="reverse-text",
    )
