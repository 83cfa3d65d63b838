"""The model's final answer: the last `<answer>...</answer>` after any reasoning.

Reasoning in `<think>` tags is dropped first (an answer tag quoted inside the reasoning does not
count, and a reply whose `<think>` never closes has not answered). Inner whitespace is kept, so
grid answers keep their rows; surrounding whitespace is stripped.
"""

from __future__ import annotations

import re

from rlkit.envs import Parser, ThinkParser

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK = ThinkParser()


def extract_answer(text: str) -> str | None:
    """The final answer, or None when the reply has no complete answer tag after reasoning."""
    visible = _THINK.parse(text) or ""
    matches = ANSWER_TAG.findall(visible)
    return matches[-1].strip() if matches else None


def format_answer(answer: str, reasoning: str = "") -> str:
    """A reply in the expected format (gold completions, SFT data)."""
    prefix = f"{reasoning}\n" if reasoning else ""
    return f"{prefix}<answer>\n{answer}\n</answer>"


class AnswerTagParser(Parser):
    """`parse_answer(completion)` is the final answer in `<answer>` tags, or None."""

    def parse(self, text: str) -> str | None:
        return extract_answer(text)
