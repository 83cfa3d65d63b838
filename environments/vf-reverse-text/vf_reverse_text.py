"""Reverse text, written against verifiers' classic API only (no rlkit import).

It has the shape of verifiers' 2025 `reverse_text` environment: a `vf.SingleTurnEnv` with an
XML parser (`<think>`, `<answer>`), a system prompt describing the format, and a rubric of an
LCS-ratio reward (weight 1) plus the parser's format reward (weight 0.2). rlkit runs it
unmodified through its verifiers bridge (`rlkit.envs.bridge`). Texts are generated offline from
`seed` unless a `dataset_name` (hub name or local path with a `text` column) is given.
"""

import random
from difflib import SequenceMatcher

import verifiers as vf
from datasets import Dataset, load_dataset


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices("abcdefghij", k=rng.randint(5, 10))) for _ in range(n)]


def load_environment(
    num_train_examples: int = 200,
    num_eval_examples: int = 20,
    seed: int = 0,
    dataset_name: str | None = None,
) -> vf.Environment:
    if dataset_name:
        texts = list(load_dataset(dataset_name, split="train")["text"])
    else:
        texts = _texts(num_train_examples + num_eval_examples, seed)
    rows = Dataset.from_dict({"question": texts, "answer": [t[::-1] for t in texts]})
    train = rows.select(range(min(num_train_examples, len(rows))))
    evaluation = rows.select(range(num_train_examples, len(rows)))

    parser = vf.XMLParser(["think", "answer"], answer_field="answer")
    system_prompt = (
        "Reverse the given text.\n\nRespond in the following format:\n" + parser.get_format_str()
    )

    def lcs_reward_func(completion, answer, **kwargs) -> float:
        """Similarity of the parsed answer and the reversed text (1.0 when exact)."""
        response = parser.parse_answer(completion) or ""
        return SequenceMatcher(None, response, answer).ratio()

    rubric = vf.Rubric(funcs=[lcs_reward_func, parser.get_format_reward_func()], weights=[1.0, 0.2])
    return vf.SingleTurnEnv(
        dataset=train,
        eval_dataset=evaluation,
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
    )
