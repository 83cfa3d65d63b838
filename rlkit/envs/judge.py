"""LLM judge: ask any OpenAI-compatible model a yes/no question about a model's answer.

Environments use it, as INTELLECT-3 does, for answers a rule-based check rejects (free-form
answers, forms a verifier cannot parse). The judge's reply is read after any `<think>` block;
it counts as "yes" when it starts with that word.
"""

from __future__ import annotations

import os

from openai import AsyncOpenAI

from rlkit.envs.parsers import ThinkParser
from rlkit.errors import UsageError


class Judge:
    """A yes/no judge behind an OpenAI-compatible API (greedy, one user message)."""

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

    async def says_yes(self, prompt: str) -> bool:
        completion = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=self.max_tokens,
        )
        verdict = ThinkParser().parse(completion.choices[0].message.content or "") or ""
        return verdict.strip().lower().startswith("yes")


def judge_from_args(
    base_url: str | None, model: str | None, api_key_var: str | None = None
) -> Judge | None:
    """The judge an environment's `judge_*` arguments ask for (None when unset)."""
    if (base_url is None) != (model is None):
        raise ValueError("set both judge_base_url and judge_model to use the LLM judge")
    return Judge(base_url, model, api_key_var) if base_url and model else None
