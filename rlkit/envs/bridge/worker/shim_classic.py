"""verifiers 0.1.x classic era (0.1.3 to 0.1.9.x), in its two shapes: up to 0.1.7
`env.rollout(client, model, prompt, answer, task, info, sampling_args) -> (completion, state)`
scored by `rubric.score_rollouts(...)`; from 0.1.8 `env.rollout(input, client, model,
sampling_args) -> State` (stop conditions, trajectory, cleanup) scored by `rubric.score_group`.

verifiers runs its own loop (`setup_state`, `is_completed`, `env_response`, tools, max_turns);
this shim only prepares the inputs the way `Environment.a_generate` does and reads the scores.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from typing import Any

import verifiers as vf
from openai.resources.chat.completions import AsyncCompletions

SPLITS = {"train": "dataset", "eval": "eval_dataset"}
# What the OpenAI client's chat `create()` takes by name (this venv's openai): verifiers passes
# sampling args to it as keyword arguments, so vLLM's own (`min_tokens`, `top_k`, ...) go in
# `extra_body`, as a verifiers user writes them.
OPENAI_CHAT_ARGS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def recorded_error(error: Any) -> RuntimeError:
    """The error verifiers recorded in a rollout's state, raised with its cause chain kept (the
    worker tells a dead server from an environment bug by it)."""
    text = repr(error)
    cause = getattr(error, "__cause__", None)
    if cause is not None:
        text += f", caused by {cause!r}"
    exc = RuntimeError(f"verifiers recorded an error: {text}")
    exc.__cause__ = error if isinstance(error, BaseException) else None
    return exc


def _info(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return json.loads(value) if value else {}
    return dict(value or {})


class Shim:
    era = "classic"
    string_prompts = False  # 0.1.x chat environments assert a list of messages

    def prompt_problem(self, prompt: Any) -> str | None:
        """Why verifiers of this era would reject the prompt (None: it takes it)."""
        if isinstance(prompt, str):
            if self.string_prompts:
                return None
            return (
                f"is text; verifiers {vf.__version__} chat environments take a list of "
                "messages (verifiers 0.2 and later turn text into one user message)"
            )
        if not isinstance(prompt, (list, tuple)):
            return f"must be a list of chat messages, got {type(prompt).__name__}"
        for position, message in enumerate(prompt):
            if not isinstance(_role(message), str):
                return f"[{position}] is not a chat message with a role: {str(message)[:80]!r}"
        return None if prompt else "is an empty list of messages"

    @staticmethod
    def prompt_view(prompt: Any) -> list[Any]:
        """The prompt as rlkit shows it: text becomes one user message, so a row verifiers
        rejects still lists (its rollout carries the error)."""
        if isinstance(prompt, (list, tuple)) and all(isinstance(_role(m), str) for m in prompt):
            return list(prompt)
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)
        return [{"role": "user", "content": text}]

    def __init__(self, env: Any) -> None:
        if not isinstance(env, vf.Environment):
            raise TypeError(f"load_environment returned {type(env).__name__}, not a vf.Environment")
        if getattr(env, "message_type", "chat") != "chat":
            raise ValueError(f"message_type={env.message_type!r}: only chat environments run")
        self.env = env
        self.state_api = "input" in inspect.signature(env.rollout).parameters  # 0.1.8+
        self.datasets = {split: self.dataset(attr) for split, attr in SPLITS.items()}

    @classmethod
    def load(cls, module: Any, env_args: dict[str, Any]) -> Shim:
        """The shim around the environment `module.load_environment(**env_args)` returns."""
        return cls(module.load_environment(**env_args))

    def dataset(self, attr: str) -> Any:
        return getattr(self.env, attr, None)

    def describe(self) -> dict[str, Any]:
        sampling = {k: v for k, v in dict(self.env.sampling_args or {}).items() if k != "n"}
        sampling.update(sampling.pop("extra_body", None) or {})
        return {
            "era": self.era,
            "verifiers_version": getattr(vf, "__version__", None),
            "env_class": type(self.env).__name__,
            "multi_turn": not isinstance(self.env, vf.SingleTurnEnv),
            "max_turns": getattr(self.env, "max_turns", 1),
            "sampling_defaults": sampling,
            "splits": {s: (len(d) if d is not None else None) for s, d in self.datasets.items()},
            "reward_weights": self.reward_weights(),
        }

    def reward_weights(self) -> list[float] | None:
        """The rubric's reward weights (`get_reward_weights` up to 0.1.7, then private)."""
        rubric = self.env.rubric
        weights = getattr(rubric, "get_reward_weights", None) or getattr(
            rubric, "_get_reward_weights", None
        )
        return [float(w) for w in weights()] if callable(weights) else None

    def row(self, split: str, index: int) -> dict[str, Any]:
        dataset = self.datasets[split]
        if dataset is None:
            raise ValueError(f"the environment has no {split} split")
        row = dict(dataset[index])
        problem = self.prompt_problem(row.get("prompt"))
        if problem is not None:
            where = f"{split} row {index} (example_id {row.get('example_id', index)})"
            raise ValueError(f"{where}: field 'prompt' {problem}")
        info = _info(row.get("info"))
        old_api_tools = not self.state_api and getattr(self.env, "oai_tools", None)
        if old_api_tools and "oai_tools" not in info:  # where <0.1.8 rollouts read the tools
            info["oai_tools"] = self.env.oai_tools
        row["info"] = info
        row.setdefault("answer", "")
        row.setdefault("task", "default")
        return row

    def rows(self, split: str, start: int, count: int) -> list[dict[str, Any]]:
        dataset = self.datasets[split]
        out = []
        for index in range(start, min(start + count, len(dataset))):
            row = dataset[index]
            info = _info(row.get("info"))
            info.setdefault("task", row.get("task") or "default")
            out.append(
                {
                    "prompt": self.prompt_view(row.get("prompt")),
                    "answer": row.get("answer") or "",
                    "info": info,
                    "example_id": row.get("example_id", index),
                }
            )
        return out

    def sampling_args(self, sampling: dict) -> dict[str, Any]:
        """The environment's sampling args under rlkit's, one completion per request, asking for
        the engine's token ids and logprobs (the worker's transport adds them when missing)."""
        args = copy.deepcopy(dict(self.env.sampling_args or {}))
        args.pop("n", None)
        args.update(sampling)
        args["logprobs"] = True
        server_only = {k: args.pop(k) for k in list(args) if k not in OPENAI_CHAT_ARGS}
        extra = args.get("extra_body") or {}
        args["extra_body"] = {**extra, **server_only, "return_token_ids": True}
        return args

    async def rollout(self, row: dict[str, Any], client: Any, model: str, sampling: dict) -> Any:
        args = self.sampling_args(sampling)
        if self.state_api:
            fields = ("prompt", "answer", "task", "info", "example_id")
            vf_input = {k: copy.deepcopy(row[k]) for k in fields if k in row}
            state = await self.env.rollout(vf_input, client, model, args)
            if state.get("error") is not None:
                raise recorded_error(state["error"])
            return list(state.get("completion") or []), state
        return await self.env.rollout(
            client,
            model,
            copy.deepcopy(row["prompt"]),
            row["answer"],
            row["task"],
            copy.deepcopy(row["info"]),
            args,
        )

    async def score(self, items: list[tuple[dict, Any, Any]]) -> list[tuple[float, dict]]:
        if self.state_api:
            states = [state for _, _, state in items]
            await self.env.rubric.score_group(states, score_sem=asyncio.Semaphore(64))
            return [
                (float(s["reward"] or 0.0), {k: float(v) for k, v in (s["metrics"] or {}).items()})
                for s in states
            ]
        scores = await self.env.rubric.score_rollouts(
            prompts=[row["prompt"] for row, _, _ in items],
            completions=[completion for _, completion, _ in items],
            answers=[row["answer"] for row, _, _ in items],
            states=[state for _, _, state in items],
            tasks=[row["task"] for row, _, _ in items],
            infos=[row["info"] for row, _, _ in items],
            apply_weights=True,
        )
        metrics = {name: list(values) for name, values in (scores.metrics or {}).items()}
        return [
            (float(reward), {name: float(v[i]) for name, v in metrics.items()})
            for i, reward in enumerate(scores.reward)
        ]
