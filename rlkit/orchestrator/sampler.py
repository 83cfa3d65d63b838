"""Which prompt to roll out next: environments mixed by weight, then online difficulty pools.

Every example starts in the `normal` pool. After each group its solve rate (share of
rollouts with reward >= `solve_threshold`) moves it to `easy` (rate >= easy_threshold) or
`hard` (rate <= hard_threshold) or back to `normal`. A draw first picks an environment by
weight, then a pool by the configured fractions (renormalised over non-empty pools); normal
examples are read in a shuffled order per epoch (the data position), easy and hard ones at
random. All of it (RNG, cursors, pools) is plain JSON so a resumed run continues the stream.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, model_validator

from rlkit.config import Config

LEVELS = ("easy", "normal", "hard")


class DifficultyConfig(Config):
    enabled: bool = Field(True, description="Track per-example solve rates in easy/normal/hard.")
    easy_fraction: float = Field(0.0, ge=0, le=1, description="Share of draws from easy examples.")
    hard_fraction: float = Field(0.0, ge=0, le=1, description="Share of draws from hard examples.")
    solve_threshold: float = Field(1.0, description="A rollout with reward >= this is solved.")
    easy_threshold: float = Field(1.0, ge=0, le=1, description="Solve rate >= this: easy.")
    hard_threshold: float = Field(0.0, ge=0, le=1, description="Solve rate <= this: hard.")

    @model_validator(mode="after")
    def _fractions(self) -> DifficultyConfig:
        if self.easy_fraction + self.hard_fraction > 1:
            raise ValueError("easy_fraction + hard_fraction must be at most 1")
        return self


class PromptSampler:
    """Draws `(env_id, example_index)` pairs and keeps per-example difficulty levels."""

    def __init__(
        self,
        sizes: dict[str, int],
        weights: dict[str, float],
        difficulty: DifficultyConfig,
        seed: int = 0,
    ) -> None:
        empty = [env_id for env_id, n in sizes.items() if n == 0]
        if empty:
            raise ValueError(f"environment(s) with an empty dataset: {empty}")
        self.sizes = sizes
        self.weights = weights
        self.difficulty = difficulty
        self.seed = seed
        self.rng = random.Random(seed)
        self.cursor: dict[str, list[int]] = {env_id: [0, 0] for env_id in sizes}  # epoch, pos
        self.level: dict[str, dict[int, str]] = {env_id: {} for env_id in sizes}  # non-normal
        self._orders: dict[str, tuple[int, list[int]]] = {}  # env_id -> (epoch, its order)

    # ---- drawing ------------------------------------------------------------------------
    def sample(self) -> tuple[str, int]:
        env_id, index, _ = self.sample_prompt()
        return env_id, index

    def sample_prompt(self) -> tuple[str, int, int]:
        """`(env_id, index, epoch)`; epoch is -1 for a draw from the easy or hard pool."""
        env_ids = list(self.sizes)
        env_id = self.rng.choices(env_ids, weights=[self.weights[e] for e in env_ids])[0]
        level = self._pick_level(env_id)
        if level == "normal":
            index = self._next_normal(env_id)
            return env_id, index, self.cursor[env_id][0]
        members = sorted(i for i, lv in self.level[env_id].items() if lv == level)
        return env_id, self.rng.choice(members), -1

    def _pick_level(self, env_id: str) -> str:
        counts = self.counts(env_id)
        d = self.difficulty
        fractions = {"easy": d.easy_fraction, "hard": d.hard_fraction}
        fractions["normal"] = max(0.0, 1.0 - d.easy_fraction - d.hard_fraction)
        live = {lv: fractions[lv] for lv in LEVELS if counts[lv] > 0 and fractions[lv] > 0}
        if not live:  # e.g. every example is easy and easy_fraction is 0: take what exists
            live = {lv: 1.0 for lv in LEVELS if counts[lv] > 0}
        return self.rng.choices(list(live), weights=list(live.values()))[0]

    def _order(self, env_id: str, epoch: int) -> list[int]:
        """The epoch's shuffled order, a function of (seed, env, epoch); kept per environment
        since shuffling the whole dataset on every draw cost O(dataset) per prompt."""
        cached = self._orders.get(env_id)
        if cached is None or cached[0] != epoch:
            order = list(range(self.sizes[env_id]))
            random.Random(f"{self.seed}/{env_id}/{epoch}").shuffle(order)
            self._orders[env_id] = cached = (epoch, order)
        return cached[1]

    def _next_normal(self, env_id: str) -> int:
        """The next normal example in this epoch's shuffled order (the data position)."""
        epoch, pos = self.cursor[env_id]
        order = self._order(env_id, epoch)
        for _ in range(2 * len(order)):
            if pos >= len(order):
                epoch, pos = epoch + 1, 0
                order = self._order(env_id, epoch)
            index = order[pos]
            pos += 1
            if index not in self.level[env_id]:
                self.cursor[env_id] = [epoch, pos]
                return index
        raise AssertionError("no normal example although the normal pool is non-empty")

    # ---- feedback -----------------------------------------------------------------------
    def observe(self, env_id: str, index: int, rewards: list[float]) -> None:
        """Move an example between pools after a group of rollouts (errored ones excluded)."""
        d = self.difficulty
        if not d.enabled or not rewards:
            return
        rate = sum(r >= d.solve_threshold for r in rewards) / len(rewards)
        if rate >= d.easy_threshold:
            self.level[env_id][index] = "easy"
        elif rate <= d.hard_threshold:
            self.level[env_id][index] = "hard"
        else:
            self.level[env_id].pop(index, None)

    def counts(self, env_id: str) -> dict[str, int]:
        levels = list(self.level[env_id].values())
        easy, hard = levels.count("easy"), levels.count("hard")
        return {"easy": easy, "normal": self.sizes[env_id] - easy - hard, "hard": hard}

    # ---- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "rng": [version, list(internal), gauss],
            "cursor": self.cursor,
            "level": {e: {str(i): lv for i, lv in m.items()} for e, m in self.level.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        for env_id in self.sizes:
            if env_id in state["cursor"]:
                self.cursor[env_id] = list(state["cursor"][env_id])
            levels = state["level"].get(env_id, {})
            self.level[env_id] = {
                int(i): lv for i, lv in levels.items() if int(i) < self.sizes[env_id]
            }
