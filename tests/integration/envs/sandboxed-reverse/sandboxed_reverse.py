"""A test environment whose reward is computed by a program run in the sandbox
(`rlkit.sandbox.run`: in-process bubblewrap, or the run's sandbox service with `[sandbox] serve`),
the way a code environment's tests run: how close the completion is to the reversed text."""

from __future__ import annotations

from typing import Any

from datasets import Dataset

from rlkit import sandbox
from rlkit.envs import Rubric, SingleTurnEnv


async def similarity(completion: list[dict[str, Any]], answer: str) -> float:
    text = completion[-1]["content"]
    program = f"import difflib\nprint(difflib.SequenceMatcher(None, {text!r}, {answer!r}).ratio())"
    result = await sandbox.run(program, timeout=30)
    if result.status != "ok":
        raise RuntimeError(f"the reward's program ended {result.status}: {result.stderr[-300:]}")
    return float(result.stdout)


def load_environment(n: int = 20) -> SingleTurnEnv:
    sandbox.require()  # the reward runs programs: refuse now, with the fix, if nothing isolates
    texts = [("abcdefghij" * 2)[i % 10 : i % 10 + 4] for i in range(n)]
    return SingleTurnEnv(
        dataset=Dataset.from_dict({"question": texts, "answer": [t[::-1] for t in texts]}),
        system_prompt="Reverse the text.",
        rubric=Rubric([similarity], [1.0]),
        env_id="sandboxed-reverse",
    )
