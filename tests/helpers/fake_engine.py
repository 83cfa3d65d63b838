"""A fake rollout source for scheduler tests: completions of controlled lengths, produced token
by token, each turn stamped with the policy versions current when it started and finished (as
the real client does from the server's X-Policy-Version header)."""

from __future__ import annotations

import asyncio
import itertools

from rlkit.envs import Rollout, Turn
from rlkit.orchestrator.batching import GroupProcessor
from rlkit.orchestrator.prompts import Prompt


class FakeEngine:
    """Rollouts with completion lengths drawn from `lengths`; tests bump `version`."""

    def __init__(self, lengths, group_size: int = 2, turns: int = 1, token_s: float = 1e-4):
        self.lengths = iter(lengths)
        self.group_size = group_size
        self.turns = turns
        self.token_s = token_s
        self.version = 0
        self.ids = itertools.count()
        self.started: list[int] = []
        self.gate: asyncio.Event | None = None  # when set by a test: rollouts wait after turn 1
        self.at_gate = 0

    async def rollout(self, length: int) -> Rollout:
        rid = next(self.ids)
        self.started.append(rid)
        turns = []
        for _ in range(self.turns):
            start = self.version
            for _ in range(length):
                await asyncio.sleep(self.token_s)
            turns.append(
                Turn(
                    prompt_token_ids=[1, 2, 3],
                    completion_token_ids=[5] * length,
                    completion_logprobs=[-0.5] * length,
                    policy_version_start=start,
                    policy_version_end=self.version,
                )
            )
            if self.gate is not None and len(turns) == 1:
                self.at_gate += 1
                await self.gate.wait()
        # multi-turn: each turn's prompt extends the previous conversation
        context: list[int] = [1, 2, 3]
        for turn in turns:
            turn.prompt_token_ids = list(context)
            context += turn.completion_token_ids + [7]
        return Rollout(env_id="fake", example_id=rid, turns=turns, reward=float(rid % 3))

    async def next_group(self, prompt: Prompt):
        lengths = [next(self.lengths) for _ in range(self.group_size)]
        return list(await asyncio.gather(*(self.rollout(n) for n in lengths)))


def processor() -> GroupProcessor:
    return GroupProcessor(advantage="grpo", drop_zero_advantage=True, solve_threshold=1.0)
