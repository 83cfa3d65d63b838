"""Rubric: weighted reward functions that score rollouts.

A reward function declares the inputs it wants by parameter name and may be sync or async:
per-rollout functions take any of `prompt, completion, answer, state, info, parser` (and
`**kwargs` to get them all) and return a float; group functions (registered with `group=True`)
take the lists `prompts, completions, answers, states, infos` (plus `parser`) for all rollouts of
one example and return one float per rollout. Reward = sum of weight * score, and every function's
score is also recorded as a metric under its name. A raising function marks the rollout errored
with a message naming the function, and its reward is 0.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit.envs.parsers import Parser
from rlkit.envs.rollout import Rollout

ROLLOUT_ARGS = ("prompt", "completion", "answer", "state", "info", "parser")
GROUP_ARGS = ("prompts", "completions", "answers", "states", "infos", "parser")


@dataclass
class RewardFunc:
    func: Callable[..., Any]
    weight: float
    group: bool

    @property
    def name(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)


@functools.cache
def _wanted_args(func: Callable[..., Any]) -> tuple[str, ...] | None:
    """The parameter names `func` takes, or None when it takes **kwargs (read once per
    function: `inspect.signature` on every call showed in eval's profile)."""
    params = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return tuple(params)


def _call_kwargs(func: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """Select the arguments a function asks for by name (all of them if it takes **kwargs)."""
    wanted = _wanted_args(func)
    if wanted is None:
        return dict(available)
    return {name: available[name] for name in wanted if name in available}


async def call_with_available(func: Callable[..., Any], available: dict[str, Any]) -> Any:
    """Call a sync or async function with the available arguments it asks for."""
    result = func(**_call_kwargs(func, available))
    if inspect.isawaitable(result):
        result = await result
    return result


class Rubric:
    """Weighted reward functions plus the parser they may use."""

    def __init__(
        self,
        funcs: list[Callable[..., Any]] | None = None,
        weights: list[float] | None = None,
        parser: Parser | None = None,
    ) -> None:
        funcs = funcs or []
        weights = [1.0] * len(funcs) if weights is None else list(weights)
        if len(weights) != len(funcs):
            raise ValueError(f"Rubric got {len(funcs)} functions but {len(weights)} weights")
        self.parser = parser or Parser()
        self.reward_funcs: list[RewardFunc] = []
        for func, weight in zip(funcs, weights, strict=True):
            self.add_reward_func(func, weight)

    def add_reward_func(
        self, func: Callable[..., Any], weight: float = 1.0, group: bool = False
    ) -> None:
        """Register a function; `group=True` means it scores a whole group at once."""
        self.reward_funcs.append(RewardFunc(func, float(weight), group))

    async def score_group(self, rollouts: list[Rollout]) -> None:
        """Fill reward, metrics and (on failure) error of each rollout in place.

        Rollouts that already carry an error (failed generation) are not scored: reward 0.
        Group functions see only the rollouts that were scored.
        """
        t0 = time.perf_counter()
        live = [r for r in rollouts if r.error is None]
        for rollout in rollouts:
            rollout.reward = 0.0
        scores: dict[int, dict[str, float]] = {id(r): {} for r in live}
        for rf in self.reward_funcs:
            if rf.group:
                await self._score_group_func(rf, live, scores)
            else:  # async functions (sandboxed tests, judges) score the group concurrently
                await asyncio.gather(*(self._score_one(rf, r, scores) for r in live))
        for rollout in live:
            rollout.metrics.update(scores[id(rollout)])
            if rollout.error is None:
                rollout.reward = sum(
                    rf.weight * scores[id(rollout)].get(rf.name, 0.0) for rf in self.reward_funcs
                )
        elapsed = time.perf_counter() - t0
        for rollout in rollouts:
            rollout.timings["scoring_s"] = elapsed
            rollout.timings["total_s"] = rollout.timings.get("total_s", 0.0) + elapsed

    async def _score_one(
        self, rf: RewardFunc, rollout: Rollout, scores: dict[int, dict[str, float]]
    ) -> None:
        available = {
            "prompt": rollout.prompt,
            "completion": rollout.completion,
            "answer": rollout.answer,
            "state": rollout.state,
            "info": rollout.info,
            "parser": self.parser,
        }
        try:
            value = await call_with_available(rf.func, available)
            scores[id(rollout)][rf.name] = float(value)
        except Exception as exc:  # a broken reward function must not end an eval or a run
            _mark_failed(rollout, rf, exc)

    async def _score_group_func(
        self, rf: RewardFunc, rollouts: list[Rollout], scores: dict[int, dict[str, float]]
    ) -> None:
        if not rollouts:
            return
        available = {
            "prompts": [r.prompt for r in rollouts],
            "completions": [r.completion for r in rollouts],
            "answers": [r.answer for r in rollouts],
            "states": [r.state for r in rollouts],
            "infos": [r.info for r in rollouts],
            "parser": self.parser,
        }
        try:
            values = list(await call_with_available(rf.func, available))
            if len(values) != len(rollouts):
                raise ValueError(f"returned {len(values)} scores for {len(rollouts)} rollouts")
            for rollout, value in zip(rollouts, values, strict=True):
                scores[id(rollout)][rf.name] = float(value)
        except Exception as exc:
            for rollout in rollouts:
                _mark_failed(rollout, rf, exc)


def _mark_failed(rollout: Rollout, rf: RewardFunc, exc: Exception) -> None:
    if rollout.error is None:
        rollout.error = f"reward function {rf.name!r} failed: {type(exc).__name__}: {exc}"
