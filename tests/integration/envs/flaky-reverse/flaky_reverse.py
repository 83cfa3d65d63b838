"""A test environment that fails on purpose: reverse-text where some rollouts and rewards raise.

Examples with id % 5 == 1 raise inside the rollout loop (`is_completed`), ids % 5 == 2 raise in
the reward function. The orchestrator must record those rollouts as errored, keep them out of
the loss and carry on.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset

from rlkit.envs import MultiTurnEnv, Rubric


class FlakyReverse(MultiTurnEnv):
    async def is_completed(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> bool:
        if state["info"]["id"] % 5 == 1:
            raise RuntimeError("flaky environment failed in rollout")
        return True

    async def env_response(
        self, messages: list[dict[str, Any]], state: dict[str, Any]
    ) -> list[dict[str, Any]]:
        return []  # never reached: every rollout is one turn


def load_environment(n: int = 50) -> FlakyReverse:
    texts = [("abcdefghij" * 3)[i % 10 : i % 10 + 3 + i % 4] for i in range(n)]

    def reward(completion: list[dict[str, Any]], answer: str, info: dict[str, Any]) -> float:
        if info["id"] % 5 == 2:
            raise ValueError("flaky reward function failed")
        return float((completion[-1].get("content") or "").strip() == answer)

    data = Dataset.from_dict(
        {
            "question": texts,
            "answer": [t[::-1] for t in texts],
            "info": [{"id": i} for i in range(n)],
        }
    )
    return FlakyReverse(
        dataset=data,
        system_prompt="Reverse the text character by character. Reply with the reversed text only.",
        rubric=Rubric([reward], [1.0]),
        max_turns=2,
        env_id="flaky-reverse",
    )
