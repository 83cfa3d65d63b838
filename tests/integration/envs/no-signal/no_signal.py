"""A test environment without learning signal: every reward is 0, or every reward raises.

`mode="zero"`: the reward function always returns 0 (an untrained model that solves nothing).
`mode="raise"`: it always raises, so every rollout is errored. The orchestrator's no-signal
watchdog must stop such a run with a clear error and a resumable checkpoint.
"""

from __future__ import annotations

from typing import Any, Literal

from datasets import Dataset

from rlkit.envs import Rubric, SingleTurnEnv


def load_environment(mode: Literal["zero", "raise"] = "zero", n: int = 20) -> SingleTurnEnv:
    def reward(completion: list[dict[str, Any]], answer: str) -> float:
        if mode == "raise":
            raise ValueError("no-signal reward function failed on purpose")
        return 0.0

    texts = [("abcdefghij" * 2)[i % 10 : i % 10 + 4] for i in range(n)]
    return SingleTurnEnv(
        dataset=Dataset.from_dict({"question": texts, "answer": [t[::-1] for t in texts]}),
        system_prompt="Reverse the text.",
        rubric=Rubric([reward], [1.0]),
        env_id="no-signal",
    )
