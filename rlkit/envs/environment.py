"""The `Environment` base class: a dataset of tasks, a rollout procedure and a rubric.

Rows have `prompt` (chat messages), `answer`, `info` (dict) and `example_id`; datasets given with
`question` (+ an optional system prompt) instead of `prompt`, or with string prompts, are
converted on first use (`rlkit.envs.rows`), so every consumer (eval, orchestrator) sees one shape
and an eval never formats the training rows.
Subclasses implement `rollout`; scoring and running a group of rollouts for one example are
shared.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from datasets import Dataset

from rlkit.envs.data import quiet_datasets
from rlkit.envs.exploits import Exploit
from rlkit.envs.parsers import Parser
from rlkit.envs.rollout import Rollout
from rlkit.envs.rows import Messages, clean_messages, format_row
from rlkit.envs.rubric import Rubric
from rlkit.envs.sampling import SamplingLayer, resolve_sampling
from rlkit.envs.turns import group_first_turn
from rlkit.inference import InferenceClient


def check_columns(dataset: Dataset) -> None:
    """Raise unless the dataset has a `prompt` or a `question` column (what rows are built from)."""
    columns = set(dataset.column_names)
    if "prompt" not in columns and "question" not in columns:
        raise ValueError(f"dataset needs a 'prompt' or a 'question' column, has {sorted(columns)}")


def format_dataset(dataset: Dataset, system_prompt: str | None = None) -> Dataset:
    """Give a dataset the `prompt`, `answer`, `info`, `example_id` columns (keeping the rest),
    each row normalised by `rlkit.envs.rows.format_row` (a bad row raises `RowError`)."""
    check_columns(dataset)

    def to_row(row: dict[str, Any], index: int) -> dict[str, Any]:
        return format_row(row, index, system_prompt)

    with quiet_datasets():
        return dataset.map(to_row, with_indices=True)


class Environment:
    """A task distribution plus how to roll out and score it; subclass and implement `rollout`."""

    def __init__(
        self,
        dataset: Dataset | None = None,
        eval_dataset: Dataset | None = None,
        system_prompt: str | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling_defaults: dict[str, Any] | None = None,
        env_id: str = "",
    ) -> None:
        if dataset is None and eval_dataset is None:
            raise ValueError("an environment needs a dataset or an eval_dataset")
        self.env_id = env_id
        self.system_prompt = system_prompt
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        for rows in (dataset, eval_dataset):
            if rows is not None:
                check_columns(rows)  # a bad dataset fails on construction, formatted or not
        self._raw_datasets = {"train": dataset, "eval": eval_dataset}
        self.sampling_defaults: dict[str, Any] = dict(sampling_defaults or {})
        self.version: str | None = None  # set by load_environment from the package metadata
        # the family's exploit policies `rlkit env audit` plays (rlkit.envs.exploits)
        self.exploits: list[Exploit] = []

    def close(self) -> None:
        """Release what the environment holds outside this process (a bridged environment's
        worker); rlkit's commands call it when they are done with the environment. Safe to call
        twice; the base environment holds nothing."""

    @functools.cached_property
    def dataset(self) -> Dataset | None:
        """The training rows, formatted on first use (`rlkit eval` never formats them)."""
        return self._formatted("train")

    @functools.cached_property
    def eval_dataset(self) -> Dataset | None:
        """The evaluation rows, formatted on first use."""
        return self._formatted("eval")

    def _formatted(self, split: str) -> Dataset | None:
        rows = self._raw_rows(split)
        return None if rows is None else format_dataset(rows, self.system_prompt)

    def _raw_rows(self, split: str) -> Dataset | None:
        """The unformatted rows of `split` ("train" or "eval"), read once, on first use: a
        subclass whose rows are costly to build can build them here instead of in __init__."""
        return self._raw_datasets[split]

    def get_dataset(self, n: int = -1) -> Dataset:
        """The training rows (the eval rows when there is no training set); first n if n > 0."""
        ds = self.dataset if self.dataset is not None else self.eval_dataset
        assert ds is not None
        return ds.select(range(min(n, len(ds)))) if n > 0 else ds

    def get_eval_dataset(self, n: int = -1) -> Dataset:
        """The evaluation rows (the training rows when there is no eval set); first n if n > 0."""
        ds = self.eval_dataset if self.eval_dataset is not None else self.dataset
        assert ds is not None
        return ds.select(range(min(n, len(ds)))) if n > 0 else ds

    def sampling_for(self, *layers: SamplingLayer) -> dict[str, Any]:
        """The environment's sampling defaults under the caller's layers (`resolve_sampling`)."""
        return resolve_sampling(self.sampling_defaults, *layers)

    def new_rollout(self, row: dict[str, Any]) -> Rollout:
        """An empty rollout for a dataset row."""
        return Rollout(
            env_id=self.env_id,
            example_id=row.get("example_id", 0),
            prompt=clean_messages(row["prompt"]),
            answer="" if row.get("answer") is None else str(row["answer"]),
            info=dict(row.get("info") or {}),
        )

    def gold_completion(self, row: dict[str, Any]) -> Messages | None:
        """The assistant messages a perfect model would send for `row`, one per model turn.

        OpenAI chat format; tool environments return assistant messages with `tool_calls`
        followed by the final assistant message. `rlkit env check --gold` plays them through
        `rollout` and expects the maximum reward. None: no gold answer is known (the default).
        """
        return None

    def reward_bounds(self) -> tuple[float, float]:
        """(minimum, maximum) reward, assuming each reward function scores in [0, 1].

        Environments whose functions score outside [0, 1] override this; `rlkit env check`
        expects gold completions at the maximum and empty or garbage replies at the minimum.
        """
        weights = [rf.weight for rf in self.rubric.reward_funcs]
        return sum(w for w in weights if w < 0), sum(w for w in weights if w > 0)

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        """Generate one conversation for `row`; never raises for model or env failures."""
        raise NotImplementedError

    async def score_group(self, rollouts: list[Rollout]) -> None:
        """Fill reward, metrics and error of each rollout (group functions see all of them)."""
        await self.rubric.score_group(rollouts)

    async def run_group(
        self,
        row: dict[str, Any],
        client: InferenceClient,
        model: str,
        sampling: dict[str, Any],
        n: int,
    ) -> list[Rollout]:
        """n rollouts of one row concurrently (first turns as one request), scored together.

        Never raises for an environment bug: a rollout that raises comes back errored, and a
        scoring failure marks every rollout of the group errored (eval and training both go on).
        """
        with group_first_turn(n):  # the rollout tasks copy this context when gather makes them
            rollouts = list(
                await asyncio.gather(
                    *(self._safe_rollout(row, client, model, sampling) for _ in range(n))
                )
            )
        try:
            await self.score_group(rollouts)
        except Exception as exc:
            for rollout in rollouts:
                rollout.error = rollout.error or f"scoring failed: {type(exc).__name__}: {exc}"
        return rollouts

    async def _safe_rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        try:
            return await self.rollout(row, client, model, sampling)
        except Exception as exc:
            rollout = self.new_rollout(row)
            rollout.error = f"rollout failed: {type(exc).__name__}: {exc}"
            return rollout
