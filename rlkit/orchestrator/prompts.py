"""The run's prompt stream and its ledger: every prompt handed out is trained, dropped or owed.

Each prompt the schedulers hand to a group gets a draw number, its position in the run's
stream (0, 1, 2, ...), which is also the group's uid. A handed-out prompt stays *out* until it
is settled: taken into a batch (trained) or dropped (purged for retention, or no trainable
sample left). The orchestrator state saved with step k holds the sampler (the stream's future)
and the prompts still out at k, in draw order (the stream's owed past): a resumed run hands
those out again first, then continues the sampler, so every prompt of the stream is trained
exactly once, from any crash point, and draw numbers (group uids) never repeat in a run.
Batches record the prompts they train and the ones dropped since the previous batch, which is
what `rlkit runs audit` checks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from rlkit.orchestrator.sampler import PromptSampler


@dataclass(frozen=True)
class Prompt:
    """One handed-out prompt: `index` is its row in the environment's dataset; `epoch` the
    sampler's epoch it was read in (-1 for a draw from the easy or hard pool)."""

    draw: int
    env_id: str
    index: int
    epoch: int

    def record(self) -> dict[str, Any]:
        """Its fields as a dict (as `dataclasses.asdict`, which costs 15x more per prompt)."""
        return {"draw": self.draw, "env_id": self.env_id, "index": self.index, "epoch": self.epoch}


class PromptStream:
    """Hands out prompts in order (owed ones first) and keeps those not yet settled."""

    def __init__(self, sampler: PromptSampler, state: dict[str, Any] | None = None) -> None:
        self.sampler = sampler
        state = state or {}
        self.next_draw: int = state.get("next_draw", 0)
        self.replay: deque[Prompt] = deque(Prompt(**p) for p in state.get("owed", []))
        self.out: dict[int, Prompt] = {}  # handed out, not settled
        self.dropped: list[dict[str, Any]] = []  # settled without training since the last batch

    def take(self) -> Prompt:
        if self.replay:
            prompt = self.replay.popleft()
        else:
            env_id, index, epoch = self.sampler.sample_prompt()
            prompt = Prompt(self.next_draw, env_id, index, epoch)
            self.next_draw += 1
        self.out[prompt.draw] = prompt
        return prompt

    def trained(self, prompt: Prompt) -> None:
        del self.out[prompt.draw]

    def drop(self, prompt: Prompt, reason: str) -> None:
        del self.out[prompt.draw]
        self.dropped.append({**prompt.record(), "reason": reason})

    def take_dropped(self) -> list[dict[str, Any]]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def owed(self) -> list[Prompt]:
        """Prompts handed out (or due to be handed out again) but not settled, in draw order."""
        return sorted([*self.out.values(), *self.replay], key=lambda p: p.draw)

    def state_dict(self) -> dict[str, Any]:
        return {"next_draw": self.next_draw, "owed": [p.record() for p in self.owed()]}
