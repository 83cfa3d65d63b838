"""LLM-judge fallback: ask any OpenAI-compatible model whether an answer matches the reference.

Used, as in INTELLECT-3, only for answers the rule-based check marks wrong (e.g. answers in a
form math-verify cannot parse). The judge sees the problem, the reference answer and the model's
final answer, and must reply "yes" or "no" (`rlkit.envs.judge.Judge`).
"""

from __future__ import annotations

from rlkit.envs.judge import Judge

JUDGE_PROMPT = """You are grading a math answer.

Problem:
{question}

Reference answer: {reference}
Student's final answer: {response}

Is the student's final answer mathematically equivalent to the reference answer? \
Reply with exactly one word: yes or no."""


async def equivalent(judge: Judge, question: str, reference: str, response: str) -> bool:
    """Ask `judge` whether `response` is mathematically equivalent to `reference`."""
    prompt = JUDGE_PROMPT.format(question=question, reference=reference, response=response)
    return await judge.says_yes(prompt)
