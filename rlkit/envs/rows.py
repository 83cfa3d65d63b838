"""Dataset rows in the one shape every consumer reads, normalised as verifiers 0.2+ does it.

A row's prompt may be chat messages, a plain string (one user message), or missing with a
`question` (one user message); an environment's system prompt goes first unless the prompt
already starts with a system message. `answer`, `info` (a dict or its JSON text) and
`example_id` may be missing. A row that verifiers itself would reject (no prompt, a prompt that
is neither text nor messages, a message without a role) raises `RowError` naming the row and the
field, instead of failing somewhere later.
"""

from __future__ import annotations

import json
from typing import Any

from rlkit.errors import UsageError

Messages = list[dict[str, Any]]


class RowError(UsageError, ValueError):
    """A dataset row rlkit (and verifiers) cannot use; the message names the row and field."""

    def __init__(self, index: int, example_id: Any, field: str, problem: str) -> None:
        where = f"row {index}" + (f" (example_id {example_id})" if example_id != index else "")
        super().__init__(f"dataset {where}: field {field!r} {problem}")


def clean_messages(messages: list[dict[str, Any]]) -> Messages:
    """Drop the None keys Arrow adds when messages of different shapes share a column."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def prompt_messages(row: dict[str, Any], index: int, system_prompt: str | None = None) -> Messages:
    """The row's prompt as chat messages (see the module docstring)."""
    example_id = row.get("example_id", index)
    prompt = row.get("prompt")
    field = "prompt"
    if prompt is None and row.get("question") is not None:
        prompt, field = row["question"], "question"
        if not isinstance(prompt, str):
            raise RowError(index, example_id, field, f"must be text, got {type(prompt).__name__}")
    if prompt is None:
        raise RowError(index, example_id, "prompt", "is missing (and there is no 'question')")
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)):
        if not prompt:
            raise RowError(index, example_id, field, "is an empty list of messages")
        for position, message in enumerate(prompt):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RowError(
                    index,
                    example_id,
                    f"{field}[{position}]",
                    f"must be a chat message with a 'role', got {str(message)[:80]!r}",
                )
        messages = clean_messages(list(prompt))
    else:
        raise RowError(
            index,
            example_id,
            field,
            f"must be text or a list of chat messages, got {type(prompt).__name__}",
        )
    if system_prompt and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def format_row(row: dict[str, Any], index: int, system_prompt: str | None = None) -> dict[str, Any]:
    """`prompt`, `answer`, `info` and `example_id` of one row (the other fields are kept)."""
    prompt = prompt_messages(row, index, system_prompt)
    example_id = row.get("example_id", index)
    info = row.get("info") or {}
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except json.JSONDecodeError as exc:
            raise RowError(index, example_id, "info", f"is text but not JSON: {exc}") from exc
    if not isinstance(info, dict):
        raise RowError(index, example_id, "info", f"must be a dict, got {type(info).__name__}")
    answer = row.get("answer")
    return {
        "prompt": prompt,
        "answer": "" if answer is None else str(answer),
        "info": dict(info),
        "example_id": index if example_id is None else example_id,
    }
