"""Answer scoring: SQuAD/HotpotQA-style normalised exact match and token F1, optional LLM judge.

Normalisation lower-cases, drops punctuation and the articles a/an/the, and collapses spaces, so
"The Glass Orchard." matches "glass orchard". A question may accept several answers (MuSiQue's
aliases); the best score over them counts. The judge (`rlkit.envs.judge`: any OpenAI-compatible
endpoint) is asked only when exact match fails, as a yes/no check for free-form answers.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from rlkit.envs.judge import Judge

ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = ARTICLES.sub(" ", text.lower().translate(PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str, answers: list[str]) -> float:
    return float(any(normalize(prediction) == normalize(a) for a in answers))


def token_f1(prediction: str, answers: list[str]) -> float:
    """Best bag-of-words F1 between the prediction and any accepted answer."""
    predicted = normalize(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize(answer).split()
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


JUDGE_PROMPT = """You are grading an answer to a research question.

Question: {question}
Reference answer: {reference}
Submitted answer: {response}

Does the submitted answer state the same thing as the reference answer? \
Reply with exactly one word: yes or no."""


async def judge_agrees(judge: Judge, question: str, reference: str, response: str) -> bool:
    prompt = JUDGE_PROMPT.format(question=question, reference=reference, response=response)
    return await judge.says_yes(prompt)
