"""reverse-text: reverse a string character by character.

The answer is the plain text of the model's reply after any `<think>...</think>` reasoning
(ThinkParser), stripped of surrounding whitespace. Data is generated offline and
deterministically from `seed`: random strings of `min_len`..`max_len` characters drawn from a
small `alphabet`, which a tiny model can learn in a short CPU run. With `dataset_name`, rows come
from a hub dataset, a local data file or a dataset folder instead (its `text_column` is
reversed).

The reward (`reversal_reward`) pays only for reversal work, measured above what the cheapest
answers already earn on the row:

    reward = max(0, (s(reply) - b) / (1 - b))

- `s(x)` is prefix similarity to the reversed text: the characters `x` gets right, in order,
  before its first mistake, divided by the longer of the two lengths (extra characters cost).
  It is 1.0 only for the exact reversal, and it pays only for the next right character: a
  reply that hedges (writes a character twice where it is unsure of the order) earns no more
  than a wrong guess, which per-position credit would pay (RL on the demo learned to hedge
  under it: its reward rose while exact match fell).
- `b` is the best `s` among the row's cheap answers, computed from the row's text alone: the
  text echoed, its characters sorted (both orders), the text rotated by every k, and each of its
  characters repeated to its length (the best constant character: any other character matches
  nothing). A cheap answer that happens to be the exact reversal (a palindrome's echo) is left
  out of `b`.

So the exact reversal earns 1.0, every cheap answer above earns 0 (the empty reply's score),
and a reversal with its last character wrong keeps most of the credit (0.5 on a 3-character
string, about 0.9 on a 10-character one); each further right character adds to it.
`exact_match` (weight 0) is recorded beside the reward in every eval and training metric. The
family's exploits (`rlkit env audit`) are registered on the environment: echo, sorted, rotated,
constant character, another row's reversal.

Long context (`haystack_records = R > 0`): each prompt is a document of R records
(`record 4821: fcbhad`, distinct 4-digit keys, texts drawn as above) followed by the question
"Reverse the text of record K."; the answer is that one record's text reversed, scored by the
same reward (the cheap answers are the needle's own: echo, sorted, ...), so the model must find
the needle among R - 1 distractors. About 15 tokens a record with rlkit's tiny test tokenizer:
R = 200 gives prompts of ~3,200 tokens, R = 300 of ~4,700. Its own
exploits: a distractor record's reversal (the records just before and after the needle, the
first and the last), every record's reversal listed, the needle's key.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
from datasets import Dataset

from rlkit.envs import SingleTurnEnv, ThinkParser
from rlkit.envs.data import load_dataset_any
from rlkit.envs.exploits import Exploit, Variants, last_user_text, reply
from rlkit.envs.rubric import Rubric

SYSTEM_PROMPT = "Reverse the text character by character. Reply with the reversed text only."
DEFAULT_ALPHABET = "abcdefghij"
FAMILY = "reverse-text"


def _prefix(response: str, target: str) -> int:
    """Characters of `target` that `response` reproduces in order from the start."""
    n = 0
    for got, want in zip(response, target, strict=False):
        if got != want:
            break
        n += 1
    return n


def _similarity(response: str, target: str) -> Fraction:
    longest = max(len(response), len(target))
    return Fraction(_prefix(response, target), longest) if longest else Fraction(1)


def prefix_similarity(response: str, target: str) -> float:
    """The reversal's characters the reply gets right before its first mistake, over the longer
    of the two lengths; 1.0 only when `response == target`."""
    return float(_similarity(response, target))


def cheap_answers(text: str) -> dict[str, str]:
    """The answers that need no reversal, built from the prompt's text alone: echo, sorted
    characters (both orders), every rotation, and each of its characters repeated to its
    length."""
    answers = {
        "echo": text,
        "sorted": "".join(sorted(text)),
        "sorted descending": "".join(sorted(text, reverse=True)),
    }
    for k in range(1, len(text)):
        answers[f"rotated by {k}"] = text[k:] + text[:k]
    for ch in sorted(set(text)):
        answers[f"{ch!r} repeated"] = ch * len(text)
    return answers


@functools.lru_cache(maxsize=8192)
def _baseline(target: str) -> Fraction:
    text = target[::-1]
    return max(
        (
            _similarity(answer, target)
            for answer in cheap_answers(text).values()
            if answer != target
        ),
        default=Fraction(0),
    )


def baseline_similarity(target: str) -> float:
    """`b`: the best prefix similarity a cheap answer reaches on this row (the text is the
    target reversed); cheap answers equal to the target (a palindrome's echo) are left out."""
    return float(_baseline(target))


def reversal_score(response: str, target: str) -> float:
    """The reward: prefix similarity above the row's best cheap answer, rescaled so the
    exact reversal is 1.0 and anything no better than a cheap answer is 0 (exact fractions)."""
    b = _baseline(target)
    return float(max(Fraction(0), (_similarity(response, target) - b) / (1 - b)))


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


HAYSTACK_PROMPT = (
    "The document lists records, one a line. Reverse the text of the record the question "
    "names, character by character. Reply with the reversed text only."
)


def haystack_rows(
    needles: list[str], records: int, seed: int, min_len: int, max_len: int, alphabet: str
) -> Dataset:
    """One row per needle: a document of `records` records (distinct 4-digit keys; the needle
    at a random line among `records - 1` distractor texts), the question naming the needle's
    key; the answer is the needle reversed; `info` keeps the needle, its key and its line.
    Deterministic for a seed."""
    if records < 1 or records > 9000:
        raise ValueError(f"haystack_records must be 1..9000, got {records}")
    rng = np.random.default_rng(zlib.crc32(f"haystack/{seed}".encode()))
    # distractors drawn from a pool of random texts (drawing each anew costs seconds a run)
    pool = generate_texts(max(4 * records, 1000), seed, min_len, max_len, alphabet)
    questions, infos = [], []
    for needle in needles:
        keys = (rng.choice(9000, records, replace=False) + 1000).tolist()
        picks = rng.integers(0, len(pool), records - 1).tolist()
        texts = [pool[i] if pool[i] != needle else pool[i - 1] for i in picks]
        at = int(rng.integers(records))
        texts.insert(at, needle)
        lines = "\n".join(f"record {k}: {t}" for k, t in zip(keys, texts, strict=True))
        questions.append(f"{lines}\n\nReverse the text of record {keys[at]}.")
        infos.append({"text": needle, "key": keys[at], "line": at})
    return Dataset.from_dict(
        {"question": questions, "answer": [t[::-1] for t in needles], "info": infos}
    )


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


# --- exploits (`rlkit env audit`): the cheapest replies that do no reversal -------------------


def _wrong_only(row: dict[str, Any], texts: dict[str, str]) -> Variants:
    """Each text as a plain reply, leaving out one that is the row's answer (that is solving)."""
    answer = str(row.get("answer") or "").strip()
    return {name: reply(text) for name, text in texts.items() if text.strip() != answer}


def _text(row: dict[str, Any]) -> str:
    """The text to reverse: the needle of a haystack row, else the question itself."""
    info = row.get("info") or {}
    return str(info["text"]) if info.get("text") else last_user_text(row)


def _echo_text(env: Any, row: dict[str, Any]) -> Variants:
    text = _text(row)
    return _wrong_only(row, {"echo": text}) if text else {}


def _sorted_text(env: Any, row: dict[str, Any]) -> Variants:
    text = _text(row)
    return _wrong_only(
        row,
        {"ascending": "".join(sorted(text)), "descending": "".join(sorted(text, reverse=True))},
    )


def _rotated(env: Any, row: dict[str, Any]) -> Variants:
    text = _text(row)
    ks = sorted({k for k in (1, 2, 3, len(text) // 2, len(text) - 1) if 0 < k < len(text)})
    return _wrong_only(row, {f"by {k}": text[k:] + text[:k] for k in ks})


def _constant_characters(alphabet: str) -> Any:
    def variants(env: Any, row: dict[str, Any]) -> Variants:
        text = _text(row)
        if not text:
            return {}
        texts = {f"{ch} repeated": ch * len(text) for ch in dict.fromkeys(alphabet)}
        texts["most common character"] = Counter(text).most_common(1)[0][0] * len(text)
        return _wrong_only(row, texts)

    return variants


def _another_row(texts: list[str]) -> Any:
    def variants(env: Any, row: dict[str, Any]) -> Variants:
        text = _text(row)
        if not texts:
            return {}
        start = zlib.crc32(text.encode()) % len(texts)  # a stable pick, not the row's answer
        for other in texts[start:] + texts[:start]:
            if other != text:
                return _wrong_only(row, {"reversed": other[::-1]})
        return {}

    return variants


def _records(row: dict[str, Any]) -> list[str]:
    """A haystack row's record texts, in document order, read from its question."""
    found = re.findall(r"^record \d+: (\S+)$", last_user_text(row), flags=re.MULTILINE)
    return found if (row.get("info") or {}).get("key") else []


def _distractor(env: Any, row: dict[str, Any]) -> Variants:
    """Haystack rows: another record's reversal (the lines around the needle, first, last)."""
    records, at = _records(row), (row.get("info") or {}).get("line", 0)
    picks = {"before": at - 1, "after": at + 1, "first": 0, "last": len(records) - 1}
    texts = {
        f"{name} record reversed": records[i][::-1]
        for name, i in picks.items()
        if 0 <= i < len(records) and i != at
    }
    return _wrong_only(row, texts)


def _every_record(env: Any, row: dict[str, Any]) -> Variants:
    """Haystack rows: every record's reversal, one a line (a list of every option)."""
    records = _records(row)
    return _wrong_only(row, {"listed": "\n".join(t[::-1] for t in records)}) if records else {}


def _needle_key(env: Any, row: dict[str, Any]) -> Variants:
    """Haystack rows: the key the question names, echoed."""
    key = (row.get("info") or {}).get("key")
    return _wrong_only(row, {"key": str(key), "line": f"record {key}"}) if key else {}


def haystack_exploits() -> list[Exploit]:
    """The long-context variant's own cheap answers."""
    return [
        Exploit("distractor reversed", _distractor, "another record's reversal", FAMILY),
        Exploit("every record reversed", _every_record, "all records' reversals listed", FAMILY),
        Exploit("needle key", _needle_key, "the record's key echoed", FAMILY),
    ]


def exploits(alphabet: str, texts: list[str]) -> list[Exploit]:
    """reverse-text's cheap answers as `rlkit env audit` exploits (none is two-way)."""
    return [
        Exploit("echo text", _echo_text, "the text unreversed", FAMILY),
        Exploit("sorted", _sorted_text, "the text's characters sorted", FAMILY),
        Exploit("rotated", _rotated, "the text rotated by k characters", FAMILY),
        Exploit(
            "constant character",
            _constant_characters(alphabet),
            "one character repeated to the text's length (each of the alphabet, the commonest)",
            FAMILY,
        ),
        Exploit("another row reversed", _another_row(texts), "a different row's reversal", FAMILY),
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
    system_prompt: str | None = None,
    haystack_records: int = 0,
) -> ReverseTextEnv:
    """Build the environment; eval strings never appear in the generated training set.
    `haystack_records > 0`: the long-context variant (see the module)."""
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
        alphabet = "".join(sorted({ch for t in texts for ch in t}))
    else:
        eval_texts = generate_texts(num_eval_examples, seed + 1, min_len, max_len, alphabet)
        train_texts = generate_texts(
            num_train_examples, seed, min_len, max_len, alphabet, exclude=set(eval_texts)
        )

    parser = ThinkParser()

    def reversal_reward(completion: list[dict[str, Any]], answer: str) -> float:
        return reversal_score(parser.parse_answer(completion) or "", answer)

    def exact_match(completion: list[dict[str, Any]], answer: str) -> float:
        return float((parser.parse_answer(completion) or "") == answer)

    if haystack_records:

        def rows(texts: list[str], part: int) -> Dataset:
            return haystack_rows(
                texts, haystack_records, seed * 2 + part, min_len, max_len, alphabet
            )

    else:

        def rows(texts: list[str], part: int) -> Dataset:
            return _rows(texts)

    if system_prompt is None:
        system_prompt = HAYSTACK_PROMPT if haystack_records else SYSTEM_PROMPT
    env = ReverseTextEnv(
        dataset=rows(train_texts, 0) if train_texts else None,
        eval_dataset=rows(eval_texts, 1) if eval_texts else None,
        system_prompt=system_prompt,
        parser=parser,
        rubric=Rubric([reversal_reward, exact_match], [1.0, 0.0], parser=parser),
        sampling_defaults={"temperature": 1.0, "max_tokens": 64},
        env_id="reverse-text",
    )
    env.exploits.extend(exploits(alphabet, eval_texts + train_texts))
    if haystack_records:
        env.exploits.extend(haystack_exploits())
    return env
