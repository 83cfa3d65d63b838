"""EnvGroup: several environments trained or evaluated as one.

The datasets are concatenated (prompt, answer, info, example_id only) with `info["env_id"]`
naming the member each row belongs to; rollouts and scoring are routed to that member, so each
row is generated and scored by its own environment's logic and rubric. Rows get a fresh
`example_id` (their position in the group) and keep the member's id in `info["env_example_id"]`.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset

from rlkit.envs.environment import Environment
from rlkit.envs.rollout import Rollout
from rlkit.inference import InferenceClient


def _concat(members: dict[str, Environment], eval_split: bool) -> Dataset:
    rows = []
    for env_id, env in members.items():
        ds = env.get_eval_dataset() if eval_split else env.get_dataset()
        for row in ds:
            info = {**dict(row["info"] or {}), "env_id": env_id}
            info["env_example_id"] = row["example_id"]
            rows.append(
                {
                    "prompt": row["prompt"],
                    "answer": row["answer"],
                    "info": info,
                    "example_id": len(rows),
                }
            )
    return Dataset.from_list(rows)


class EnvGroup(Environment):
    """Route rows to member environments by `info["env_id"]`."""

    def __init__(
        self, envs: list[Environment], env_ids: list[str] | None = None, env_id: str = "group"
    ) -> None:
        ids = env_ids or [env.env_id for env in envs]
        if not envs or len(ids) != len(envs) or len(set(ids)) != len(ids) or not all(ids):
            raise ValueError(f"EnvGroup needs one distinct, non-empty id per environment: {ids}")
        self.envs = dict(zip(ids, envs, strict=True))
        for member_id, env in self.envs.items():
            env.env_id = member_id
        super().__init__(
            dataset=_concat(self.envs, eval_split=False),
            eval_dataset=_concat(self.envs, eval_split=True),
            env_id=env_id,
        )

    def member(self, row_or_rollout_info: dict[str, Any]) -> Environment:
        env_id = (row_or_rollout_info or {}).get("env_id")
        if env_id not in self.envs:
            raise KeyError(f"info['env_id']={env_id!r} is not a member of {list(self.envs)}")
        return self.envs[env_id]

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        return self.member(row.get("info") or {}).gold_completion(row)

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        return await self.member(row.get("info") or {}).rollout(row, client, model, sampling)

    async def score_group(self, rollouts: list[Rollout]) -> None:
        by_env: dict[str, list[Rollout]] = {}
        for rollout in rollouts:
            by_env.setdefault(rollout.info.get("env_id", ""), []).append(rollout)
        for env_id, members in by_env.items():
            await self.member({"env_id": env_id}).score_group(members)
