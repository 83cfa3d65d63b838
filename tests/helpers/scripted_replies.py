"""Scripted model replies for the fake OpenAI server (verifiers bridge tests)."""

from __future__ import annotations

import json
import re


def calculator(body: dict) -> str | dict:
    """Calls `add` on the question's two numbers, then states the tool's result."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return f"The sum is {last['content']}."
    text = last["content"] if isinstance(last["content"], str) else ""
    if "<answer>" in str(body["messages"][0].get("content")):  # reverse-text's format
        return f"<think>\nreverse\n</think>\n<answer>\n{text[::-1]}\n</answer>"
    a, b = re.findall(r"\d+", text)[:2]
    call = {"name": "add", "arguments": json.dumps({"a": int(a), "b": int(b)})}
    return {"content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": call}]}


def say_word(body: dict) -> str:
    """The asked word alone for apple and stone, inside a sentence otherwise (brevity differs)."""
    word = body["messages"][-1]["content"].rsplit(":", 1)[-1].strip()
    return word if word in ("apple", "stone") else f"I think {word} is it"
