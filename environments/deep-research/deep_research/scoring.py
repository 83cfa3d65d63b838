"""Answer scoring: SQuAD/HotpotQA-style normalised exact match and token F1, optional LLM judge.

Normalisation lower-cases, drops punctuation and the articles a/an/the, and collapses spaces, so
"The Glass Orchard." matches "glass orchard". A question may accept several answers (MuSiQue's
aliases); the best score over them counts. The judge (`rlkit.envs.judge`: any OpenAI-compatible
endpoint) is asked only when exact match fails, as a yes/no check for free-form answers.

Listing is refused (issue 61: "A and B" earned F1 0.67 on "Who was born earlier, A or B?"). The
question's candidates are its explicit options (`info["options"]`: both compared names, yes/no)
and the names and numbers it mentions (`question_candidates`). An answer is scored against an
accepted answer only when it names no candidate that the accepted answer does not contain and
has no more numbers than it (`accepted_answers`); otherwise every component (exact match, F1,
the judge) scores 0. So listing the options, naming the wrong option (which could share a word
with the right one: "Orsto University" for "Jinulne University"), or adding guesses earns
nothing. An alias that names more candidates than the main answer (a list) is not accepted.
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


QUESTION_NAME = re.compile(r"\d+(?:[.,]\d+)*|[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*)*")
NUMBER = re.compile(r"\d+")
# capitalised at a question's start or common in one, never a candidate by themselves
STOPWORDS = set(
    "which who whom whose what when where why how in is are was were did do does has have had "
    "of on at for from by to and or a an the this that these those name i it its if as with "
    "during after before between".split()
)


def _tokens(text: str) -> list[str]:
    return normalize(text).split()


def _contains(text: list[str], part: list[str]) -> bool:
    """`part` occurs in `text` as consecutive tokens."""
    n = len(part)
    return n > 0 and any(text[i : i + n] == part for i in range(len(text) - n + 1))


def question_candidates(question: str, options: list[str] | None = None) -> list[str]:
    """The entities a listing answer would name, normalised: the row's explicit options, then
    each capitalised name and each number of the question (leading question words dropped)."""
    found: dict[str, None] = {}
    for option in options or []:
        if normalize(str(option)):
            found.setdefault(normalize(str(option)), None)
    for match in QUESTION_NAME.findall(question):
        words = _tokens(match)
        while words and words[0] in STOPWORDS:
            words = words[1:]
        if words and not (len(words) == 1 and words[0] in STOPWORDS):
            found.setdefault(" ".join(words), None)
    return list(found)


def _named(text: list[str], candidates: list[str]) -> list[str]:
    return [c for c in candidates if _contains(text, c.split())]


def accepted_answers(prediction: str, answers: list[str], candidates: list[str]) -> list[str]:
    """The accepted answers `prediction` may be scored against: those it names no other
    candidate than and has no more numbers than. Empty: it lists, and scores 0."""
    if not answers:
        return []
    main = _named(_tokens(answers[0]), candidates)
    predicted = _tokens(prediction)
    numbers = set(NUMBER.findall(" ".join(predicted)))
    ok = []
    for index, answer in enumerate(answers):
        tokens = _tokens(answer)
        own = _named(tokens, candidates)
        if index > 0 and len(own) > len(main):
            continue  # an alias that is a list of options
        others = [c for c in candidates if c not in own]
        if _named(predicted, others):
            continue
        if len(numbers) > len(set(NUMBER.findall(" ".join(tokens)))):
            continue
        ok.append(answer)
    return ok


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
