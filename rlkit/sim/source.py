"""`SimSource`: the `RolloutSource` of a simulated run, G real `Rollout` records per group.

Each group draws G completion lengths (seeded by the prompt's draw number), sends them to the
next server of the `SimPool` and waits, in virtual time, until the last one finishes. The
rollouts it returns are ordinary `Rollout`s, read by the real group processor and scheduler:
one turn, `policy_version_start`/`_end` as the simulated server stamped them, a random reward
(so every group carries signal), and the true length in `usage["completion_tokens"]`. The turn
holds one record token per `token_unit` real tokens, so a 64k-token completion is a short list:
the budget Phi is counted in the same unit.
"""

from __future__ import annotations

import asyncio
import random

from rlkit.envs.rollout import Rollout, Turn
from rlkit.orchestrator.prompts import Prompt
from rlkit.sim.engine import GroupWait, Request, SimPool
from rlkit.sim.workload import Lengths

TURN_CACHE = 100_000


def units(tokens: int, unit: int) -> int:
    """Record tokens standing for `tokens` real ones (rounded, at least one)."""
    return max(1, (tokens + unit // 2) // unit)


class SimSource:
    """`RolloutSource` over a `SimPool` (module docstring)."""

    def __init__(
        self, pool: SimPool, lengths: Lengths, group_size: int, token_unit: int, seed: int
    ) -> None:
        self.pool = pool
        self.lengths = lengths
        self.group_size = group_size
        self.token_unit = token_unit
        self.seed = seed
        self._turns: dict[tuple[int, int, int, str], Turn] = {}

    async def next_group(self, prompt: Prompt) -> list[Rollout]:
        rng = random.Random(self.seed * 1_000_003 + prompt.draw)
        wait = GroupWait(asyncio.get_running_loop().create_future(), self.group_size)
        requests = [Request(self.lengths.draw(rng), wait) for _ in range(self.group_size)]
        self.pool.submit(requests)
        try:
            await wait.future
        except asyncio.CancelledError:  # purged: free the slots it holds
            for server in dict.fromkeys(r.server for r in requests if r.server is not None):
                server.cancel([r for r in requests if r.server is server])
            for req in requests:
                req.state = 3
            raise
        return [self._rollout(prompt, req, rng.random()) for req in requests]

    def _turn(self, req: Request) -> Turn:
        """The record turn of a request; equal turns are one shared object (nothing downstream
        mutates a turn), which saves most of the cost of building them."""
        n = units(req.length, self.token_unit)
        finish = "length" if req.length >= self.lengths.cap else "stop"
        key = (n, req.start_version, req.end_version, finish)
        turn = self._turns.get(key)
        if turn is None:
            if len(self._turns) >= TURN_CACHE:
                self._turns.clear()
            turn = self._turns[key] = Turn(
                prompt_token_ids=[1],
                completion_token_ids=[2] * n,
                completion_logprobs=[-1.0] * n,
                finish_reason=finish,
                policy_version_start=req.start_version,
                policy_version_end=req.end_version,
            )
        return turn

    def _rollout(self, prompt: Prompt, req: Request, reward: float) -> Rollout:
        turn = self._turn(req)
        return Rollout(
            env_id=prompt.env_id,
            example_id=prompt.index,
            turns=[turn],
            reward=reward,
            finish_reason=turn.finish_reason,
            prompt_mode="tokens",
            usage={"completion_tokens": req.length},
        )
