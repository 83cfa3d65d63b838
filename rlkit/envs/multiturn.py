"""Multi-turn rollouts: the model speaks, the environment answers, until a stop condition.

`MultiTurnEnv.rollout` records one `Turn` per model call (engine token ids and logprobs, finish
reason, policy versions), stops when `is_completed` says so, after `max_turns` model turns, when
the model hit its token limit (`finish_reason == "length"`) or when the next prompt would not fit
the model's context (`finish_reason == "context"`), and turns every failure into `Rollout.error`
instead of an exception. Against a server that takes token-id prompts (vLLM), turns are token in,
token out (`rlkit.envs.turns`): each prompt extends the previous prompt + completion exactly, so
the training sample is what the engine sampled. `SingleTurnEnv` is the one-turn case.
"""

from __future__ import annotations

import time
from typing import Any

from rlkit.envs.environment import Environment, Messages
from rlkit.envs.rollout import Rollout, Turn
from rlkit.envs.turns import ContextOverflow, open_turns
from rlkit.inference import Generation, InferenceClient, InferenceError


class MultiTurnEnv(Environment):
    """Subclass and implement `env_response` (and usually `is_completed`)."""

    def __init__(self, *args: Any, max_turns: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns

    def init_state(self, row: dict[str, Any]) -> dict[str, Any]:
        """Per-rollout scratch space (reward functions receive it as `state`).

        `responses` collects each turn's `Generation`; `turn` counts model turns.
        """
        return {"turn": 0, "responses": [], "info": dict(row.get("info") or {})}

    async def is_completed(self, messages: Messages, state: dict[str, Any]) -> bool:
        """True when the conversation is over (checked after each model turn)."""
        return False

    async def env_response(self, messages: Messages, state: dict[str, Any]) -> Messages:
        """The environment's reply (user or tool messages) to the last model turn."""
        raise NotImplementedError

    def tools_for_request(self, state: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """OpenAI tool schemas sent with each request of the rollout whose `state` is given
        (None: outside a rollout, e.g. measuring a prompt's fit); ToolEnv overrides."""
        return None

    def assistant_message(self, generation: Generation) -> dict[str, Any]:
        """The assistant message appended to the conversation for a model turn."""
        message: dict[str, Any] = {"role": "assistant", "content": generation.text}
        if generation.message.get("tool_calls"):
            message["tool_calls"] = generation.message["tool_calls"]
        return message

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        rollout = self.new_rollout(row)
        rollout.state = self.init_state(row)
        return await self.run_turns(rollout, client, model, sampling)

    async def run_turns(
        self, rollout: Rollout, client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        """The turns of `rollout` (its prompt and `state` set): model turn, stop conditions,
        environment reply, until done; failures are recorded on it, never raised."""
        messages: Messages = list(rollout.prompt)
        generation_s = env_s = 0.0
        prompt_tokens = completion_tokens = 0
        t0 = time.perf_counter()
        try:
            turns = await open_turns(
                client, model, self.sampling_for(sampling), self.tools_for_request(rollout.state)
            )
            rollout.prompt_mode = turns.mode
            while True:
                try:
                    generation = await turns.generate(messages)
                except ContextOverflow as exc:
                    rollout.finish_reason = "context"
                    if not rollout.turns:  # nothing to train on: say why, with the lengths
                        rollout.error = f"context: {exc}"
                    break
                generation_s += generation.latency_s
                prompt_tokens += generation.usage.get(
                    "prompt_tokens", len(generation.prompt_token_ids)
                )
                completion_tokens += generation.usage.get(
                    "completion_tokens", len(generation.completion_token_ids)
                )
                # a Turn is the Generation's token-level record (the same field names) plus
                # the sampling the request was sent with
                turn = Turn.model_validate(generation, from_attributes=True)
                turn.temperature = turns.sampling.get("temperature")
                rollout.turns.append(turn)
                rollout.finish_reason = generation.finish_reason
                rollout.state["responses"].append(generation)
                message = self.assistant_message(generation)
                messages.append(message)
                rollout.completion.append(message)
                rollout.state["turn"] = len(rollout.turns)
                if (
                    generation.finish_reason in ("length", "context")
                    or len(rollout.turns) >= self.max_turns
                    or await self.is_completed(messages, rollout.state)
                ):
                    break
                t_env = time.perf_counter()
                reply = await self.env_response(messages, rollout.state)
                env_s += time.perf_counter() - t_env
                messages.extend(reply)
                rollout.completion.extend(reply)
                turns.add_reply(reply)
        except InferenceError as exc:
            rollout.error = f"generation failed: {exc}"
        except Exception as exc:  # environment bug: record it, keep the run going
            rollout.error = f"environment error: {type(exc).__name__}: {exc}"
        rollout.timings.update(
            generation_s=generation_s, env_s=env_s, total_s=time.perf_counter() - t0
        )
        rollout.usage.update(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return rollout


class SingleTurnEnv(MultiTurnEnv):
    """One model turn per example (question -> answer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["max_turns"] = 1
        super().__init__(*args, **kwargs)

    async def env_response(self, messages: Messages, state: dict[str, Any]) -> Messages:
        return []
