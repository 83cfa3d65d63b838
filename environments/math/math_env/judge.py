"""LLM-judge fallback: ask any OpenAI-compatible model whether an answer matches the reference.

Used, as in INTELLECT-3, only for answers the rule-based check marks wrong (e.g. answers in a
form math-verify cannot parse). The judge sees the problem, the reference answer and the model's
final answer, and must reply "yes" or "no".
"""

from __future__ import annotations

import os

from openai import AsyncOpenAI

from rlkit.envs import ThinkParser
from rlkit.errors import UsageError

JUDGE_PROMPT = """You are grading a math answer.

Problem:
{question}

Reference answer: {reference}
Student's final answer: {response}

Is the student's final answer mathematically equivalent to the reference answer? \
Reply with exactly one word: yes or no."""


class Judge:
    """A yes/no equivalence judge behind an OpenAI-compatible API."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_var: str | None = None,
        timeout: float = 120.0,
        max_tokens: int = 1024,
    ) -> None:
        api_key = "EMPTY"  # local servers need no key, but the client insists on one
        if api_key_var:
            api_key = os.environ.get(api_key_var, "")
            if not api_key:
                raise UsageError(f"judge API key variable {api_key_var} is not set")
        self.model = model
        self.max_tokens = max_tokens  # room for a reasoning judge's <think> block
        self.client = AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=3
        )

    async def equivalent(self, question: str, reference: str, response: str) -> bool:
        prompt = JUDGE_PROMPT.format(question=question, reference=reference, response=response)
        completion = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=self.max_tokens,
        )
        verdict = ThinkParser().parse(completion.choices[0].message.content or "") or ""
        verdict = verdict.lower()
        return verdict.startswith("yes")
