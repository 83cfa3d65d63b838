"""Run environments written for verifiers' classic API unmodified through rlkit.

Supported: verifiers >=0.1.3,<0.1.4 (the `pip install 'rlkit[verifiers]'` extra; it installs next
to torch 2.13, transformers <5.20 and datasets 5; 0.1.4+ pull openai-agents, 0.1.6+ the Prime
sandboxes client, and 0.2/0.4 changed the environment API). Shape supported: a chat
`vf.SingleTurnEnv` or `vf.MultiTurnEnv` with a `Parser` and a `Rubric`, like the 2025
`reverse_text` environment. What is kept: the formatted dataset (`prompt`, `answer`, `task`,
`info`), sampling args, the parser, the reward functions with their weights and the rubric's
class objects (e.g. `parser`), and a multi-turn env's `is_completed` / `env_response`.
Generation goes through rlkit's `InferenceClient`, so token ids and logprobs are recorded.
Differences: `state["responses"]` holds rlkit `Generation`s rather than OpenAI objects, and a
raising reward function marks the rollout errored (verifiers logs it and scores 0).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from datasets import Dataset

from rlkit.envs.environment import Messages
from rlkit.envs.multiturn import MultiTurnEnv
from rlkit.envs.rubric import Rubric, call_with_available
from rlkit.errors import UsageError

SUPPORTED_VERSIONS = ">=0.1.3,<0.1.4"


def is_verifiers_env(obj: object) -> bool:
    """True for instances of a verifiers environment class (without importing verifiers)."""
    return any(cls.__module__.split(".")[0] == "verifiers" for cls in type(obj).__mro__)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _adapt_reward_func(func: Callable[..., Any], class_objects: dict[str, Any]) -> Callable:
    """A reward function offering verifiers' arguments (`task`, class objects) as well."""

    async def reward(prompt: Messages, completion: Messages, answer: str, state: dict, info: dict):
        available = {
            "prompt": prompt,
            "completion": completion,
            "answer": answer,
            "state": state,
            "task": info.get("task", "default"),
            "info": info,
            **class_objects,
        }
        return await call_with_available(func, available)

    reward.__name__ = getattr(func, "__name__", "reward")
    return reward


def _rlkit_rows(dataset: Dataset | None) -> Dataset | None:
    """verifiers rows -> rlkit rows: JSON-string `info` decoded, `task` kept in `info`."""
    if dataset is None:
        return None
    columns = set(dataset.column_names)

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        info = row.get("info") or {}
        info = json.loads(info) if isinstance(info, str) else dict(info)
        if "task" in columns:
            info["task"] = row["task"]
        return {"info": info}

    return dataset.map(convert)


UNLIMITED_TURNS_CAP = 64


def _turn_cap(vf_max_turns: int) -> int:
    """verifiers uses max_turns <= 0 for "until is_completed" (its SingleTurnEnv does); rlkit
    needs a finite bound, and the wrapped `is_completed` still ends the rollout first."""
    return vf_max_turns if vf_max_turns > 0 else UNLIMITED_TURNS_CAP


class VerifiersEnv(MultiTurnEnv):
    """An rlkit environment driven by a verifiers environment's data, parser and rubric."""

    def __init__(self, vf_env: Any, env_id: str = "") -> None:
        if getattr(vf_env, "message_type", "chat") != "chat":
            raise UsageError(
                f"verifiers environment {env_id!r} uses message_type="
                f"{vf_env.message_type!r}; only chat environments are supported"
            )
        self.vf_env = vf_env
        vf_rubric = vf_env.rubric
        rubric = Rubric(parser=vf_env.parser)
        for func, weight in zip(
            vf_rubric.get_reward_funcs(), vf_rubric.get_reward_weights(), strict=True
        ):
            rubric.add_reward_func(_adapt_reward_func(func, dict(vf_rubric.class_objects)), weight)
        sampling = dict(vf_env.sampling_args)
        sampling.pop("n", None)
        sampling.update(sampling.pop("extra_body", None) or {})
        super().__init__(
            dataset=_rlkit_rows(vf_env.dataset),
            eval_dataset=_rlkit_rows(vf_env.eval_dataset),
            parser=vf_env.parser,
            rubric=rubric,
            sampling_defaults=sampling,
            env_id=env_id,
            max_turns=_turn_cap(getattr(vf_env, "max_turns", 1)),
        )

    def init_state(self, row: dict[str, Any]) -> dict[str, Any]:
        info = dict(row.get("info") or {})
        return {
            "prompt": row["prompt"],
            "completion": [],
            "answer": row.get("answer", ""),
            "task": info.get("task", "default"),
            "info": info,
            "responses": [],
            "turn": 0,
        }

    def tools_for_request(self) -> list[dict[str, Any]] | None:
        return getattr(self.vf_env, "oai_tools", None) or None

    async def is_completed(self, messages: Messages, state: dict[str, Any]) -> bool:
        return bool(await _maybe_await(self.vf_env.is_completed(messages, state)))

    async def env_response(self, messages: Messages, state: dict[str, Any]) -> Messages:
        reply, new_state = await _maybe_await(self.vf_env.env_response(messages, state))
        state.update(new_state)
        return list(reply)


def wrap_verifiers_env(vf_env: Any, env_id: str = "") -> VerifiersEnv:
    """Wrap a verifiers environment object (what its module's `load_environment` returned)."""
    return VerifiersEnv(vf_env, env_id=env_id)
