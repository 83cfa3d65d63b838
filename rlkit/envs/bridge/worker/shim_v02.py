"""verifiers 0.1.10 to 0.2.x: the state loop behind verifiers' own client layer.

`env.rollout(input, client, model, sampling_args) -> State` takes a `vf.Client` (or a
`ClientConfig`); the worker's recording `AsyncOpenAI` is wrapped in verifiers'
`OpenAIChatCompletionsClient`, so verifiers still makes every call through it. Datasets may be
built lazily (`build_dataset`), tasks are JSON objects (string tasks are dropped), messages in
the state are pydantic models (the worker dumps them to JSON), and groups are scored by
`rubric.score_group(states)`.
"""

from __future__ import annotations

import copy
from typing import Any

from shim_classic import Shim as ClassicShim
from shim_classic import recorded_error
from verifiers.clients import OpenAIChatCompletionsClient


def _openai_message(message: Any) -> dict[str, Any]:
    """A verifiers 0.2 message as an OpenAI chat message (tool calls under `function`)."""
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else message
    data = dict(data)
    calls = data.get("tool_calls")
    if calls:
        data["tool_calls"] = [
            call
            if "function" in call
            else {
                "id": call.get("id", ""),
                "type": "function",
                "function": {"name": call.get("name"), "arguments": call.get("arguments")},
            }
            for call in calls
        ]
    return data


class Shim(ClassicShim):
    era = "0.1.10-0.2.x"
    string_prompts = True  # verifiers' `normalize_messages` makes text one user message

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.state_api = True
        self.clients: dict[int, OpenAIChatCompletionsClient] = {}

    def dataset(self, attr: str) -> Any:
        build = getattr(self.env, f"build_{attr}", None)
        return build() if callable(build) else getattr(self.env, attr, None)

    async def rollout(self, row: dict[str, Any], client: Any, model: str, sampling: dict) -> Any:
        args = self.sampling_args(sampling)
        if id(client) not in self.clients:
            self.clients[id(client)] = OpenAIChatCompletionsClient(client)
        fields = ("prompt", "answer", "task", "info", "example_id")
        vf_input = {k: copy.deepcopy(row[k]) for k in fields if k in row}
        if not isinstance(vf_input.get("task"), dict):  # 0.2 takes only JSON-object tasks
            vf_input.pop("task", None)
        state = await self.env.rollout(vf_input, self.clients[id(client)], model, args)
        if state.get("error") is not None:
            raise recorded_error(state["error"])
        return [_openai_message(m) for m in state.get("completion") or []], state

    async def score(self, items: list[tuple[dict, Any, Any]]) -> list[tuple[float, dict]]:
        states = [state for _, _, state in items]
        await self.env.rubric.score_group(states)
        return [
            (float(s["reward"] or 0.0), {k: float(v) for k, v in (s["metrics"] or {}).items()})
            for s in states
        ]
