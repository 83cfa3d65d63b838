"""Find the program in a model's answer: the last ```python block, else the last fenced block of
any language, else the whole answer when it parses as Python."""

from __future__ import annotations

import ast
import re

FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The program to grade, or None when the answer holds no recognisable code."""
    text = THINK.sub("", text)
    blocks = FENCE.findall(text)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    stripped = text.strip()
    if not stripped:
        return None
    try:
        ast.parse(stripped)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        # CPython's parser gives up with MemoryError on some long non-code replies ("a a a ...")
        return None
    return stripped
