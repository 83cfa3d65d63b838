"""Parsers turn a model's completion into the answer a reward function compares.

`Parser` is the identity, `ThinkParser` drops reasoning in `<think>` tags, `XMLParser` reads
named XML fields and scores their format, and `extract_boxed_answer` finds the last `\\boxed{}`.
All parsers accept a completion as plain text or as chat messages (the last assistant message).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Messages = list[dict[str, Any]]


def last_assistant_text(completion: str | Messages) -> str:
    """The text of the last assistant message (or the completion itself when it is text)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


class Parser:
    """Identity parser: the answer is the last assistant message's text."""

    def parse(self, text: str) -> Any:
        return text

    def parse_answer(self, completion: str | Messages) -> str | None:
        parsed = self.parse(last_assistant_text(completion))
        return parsed if parsed is None or isinstance(parsed, str) else str(parsed)


class ThinkParser(Parser):
    """Drops reasoning: text after the last `</think>`; an unclosed leading `<think>` yields "".

    A completion that never closes its `<think>` has not answered yet, so it parses to "".
    A completion with `</think>` but no opening tag (the template opened it) keeps what follows.
    `extract_fn` post-processes the answer text (e.g. `extract_boxed_answer`).
    """

    def __init__(self, extract_fn: Callable[[str], str | None] | None = None) -> None:
        self.extract_fn = extract_fn

    def parse(self, text: str) -> str | None:
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        elif text.lstrip().startswith("<think>"):
            text = ""
        text = text.strip()
        return self.extract_fn(text) if self.extract_fn else text


class XMLParser(Parser):
    """Reads `<field>...</field>` values; `parse_answer` returns `answer_field` (last field)."""

    def __init__(self, fields: list[str], answer_field: str | None = None) -> None:
        if not fields:
            raise ValueError("XMLParser needs at least one field")
        self.fields = list(fields)
        self.answer_field = answer_field or self.fields[-1]
        self._patterns = {
            f: re.compile(rf"<{re.escape(f)}>\s*(.*?)\s*</{re.escape(f)}>", re.DOTALL)
            for f in self.fields
        }

    def parse(self, text: str) -> dict[str, str | None]:
        """Field -> stripped content of its last occurrence (None when absent)."""
        values: dict[str, str | None] = {}
        for field, pattern in self._patterns.items():
            matches = pattern.findall(text)
            values[field] = matches[-1] if matches else None
        return values

    def parse_answer(self, completion: str | Messages) -> str | None:
        return self.parse(last_assistant_text(completion))[self.answer_field]

    def format(self, **values: str) -> str:
        """Render field values as the XML the parser reads (for few-shot and SFT data)."""
        return "\n".join(f"<{k}>\n{v}\n</{k}>" for k, v in values.items())

    def format_reward(self, completion: str | Messages) -> float:
        """Fraction of fields present exactly once, averaged over assistant messages."""
        if isinstance(completion, str):
            texts = [completion]
        else:
            texts = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
        if not texts:
            return 0.0
        scores = []
        for text in texts:
            present = sum(len(self._patterns[f].findall(text)) == 1 for f in self.fields)
            scores.append(present / len(self.fields))
        return sum(scores) / len(scores)

    def get_format_reward_func(self) -> Callable[..., float]:
        """A reward function (named `format_reward`) for use in a Rubric."""

        def format_reward(completion: str | Messages) -> float:
            return self.format_reward(completion)

        return format_reward
