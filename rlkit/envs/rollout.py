"""The rollout record shared by eval, training and the hub.

A `Rollout` is one conversation between a model and an environment: the chat messages, one
`Turn` per model call with the engine's exact token ids and logprobs, and the rubric's verdict.
It round-trips through JSON (`model_dump()` / `Rollout(**data)`), which is how eval runs store it.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from rlkit.envs.sampling import logprob_temperature


class Turn(BaseModel):
    """One model call exactly as the engine saw and produced it."""

    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    completion_logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None
    policy_version_start: int | None = None
    policy_version_end: int | None = None
    # the temperature the request was sent with (None: not sent, the engine's default of 1);
    # recorded here so the trainer divides its logits by what the engine sampled at
    temperature: float | None = None
    # MoE (R3): the engine's expert ids for prompt + completion tokens but the last, base64
    # .npy [tokens, layers, top_k] (vLLM's `routed_experts` format); None when not requested
    routed_experts: str | None = None


@dataclass(frozen=True)
class TrainingTokens:
    """A whole conversation as one token sequence: what the trainer trains on."""

    token_ids: list[int]
    loss_mask: list[int]  # 1 = model token (trained on), 0 = prompt or environment token
    inference_logprobs: list[float]  # the engine's logprob where loss_mask is 1, else 0.0
    temperature: float  # what the engine's logprobs are of (`logprob_temperature` of the turns)
    # [tokens, layers, top_k] engine expert ids, -1 where unknown; None if no turn has routing
    routing: np.ndarray | None = None


def decode_routed_experts(b64: str) -> np.ndarray:
    """vLLM's base64 .npy `routed_experts` as an int16 array [tokens, layers, top_k]."""
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False).astype(np.int16)


class Rollout(BaseModel):
    """One conversation plus its score; `error` is set when generation, env or scoring failed."""

    env_id: str = ""
    example_id: int | str = 0
    prompt: list[dict[str, Any]] = Field(default_factory=list)
    completion: list[dict[str, Any]] = Field(default_factory=list)
    answer: str = ""
    info: dict[str, Any] = Field(default_factory=dict)
    turns: list[Turn] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    finish_reason: str | None = None
    # How the turns were sent: "tokens" (token-id prompts, exact continuations) or "messages"
    # (the server re-rendered the conversation each turn).
    prompt_mode: str = "messages"
    timings: dict[str, float] = Field(default_factory=dict)
    usage: dict[str, int] = Field(default_factory=dict)
    # Scratch space of the environment during the rollout (reward functions read it as `state`);
    # it may hold objects that are not JSON, so it is never serialised.
    state: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    @property
    def policy_versions(self) -> list[int]:
        """Distinct policy versions (sorted) that generated any part of this rollout."""
        versions = {
            v
            for turn in self.turns
            for v in (turn.policy_version_start, turn.policy_version_end)
            if v is not None
        }
        return sorted(versions)

    @property
    def exact_continuation(self) -> bool:
        """True when every turn's prompt extends the previous prompt + completion token for token.

        Always true for token-in/token-out rollouts (`prompt_mode == "tokens"`); a message-path
        rollout is true only when the server's re-rendered history happened to match.
        """
        turns = self.turns  # indexed, not zip(turns, turns[1:]): most rollouts have one turn
        for i in range(1, len(turns)):
            seen = turns[i - 1].prompt_token_ids + turns[i - 1].completion_token_ids
            if turns[i].prompt_token_ids[: len(seen)] != seen:
                return False
        return True

    def training_sample(self) -> TrainingTokens:
        """Token ids, loss mask and inference logprobs over the whole conversation.

        Model tokens get mask 1 and their engine logprob; prompt and environment tokens get mask
        0 and logprob 0.0. When the turns are exact continuations (always, for token-in/token-out
        rollouts) they concatenate into one sequence: every sampled token, once, in order. For a
        message-path rollout whose re-rendered history broke that prefix property (a template
        that drops earlier reasoning, a BPE that re-merges generated tokens), the sequence keeps
        the longest common prefix and continues with the later turn's prompt as context (mask 0):
        it is exactly what the engine saw for the last turn, and only tokens still in it keep
        their training signal (`exact_continuation` tells these rollouts apart).

        Routing (R3): the last turn's prompt is the whole conversation before its completion,
        so its routing (prompt + completion but the last sampled token, which was never
        forwarded) covers the sequence; the last position stays -1 (the trainer routes it).
        """
        tokens: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        routing: np.ndarray | None = None
        for turn in self.turns:
            prompt, completion = turn.prompt_token_ids, turn.completion_token_ids
            if len(turn.completion_logprobs) != len(completion):
                raise ValueError(
                    f"rollout {self.example_id}: a turn has {len(completion)} "
                    f"completion tokens but {len(turn.completion_logprobs)} logprobs"
                )
            common = len(tokens)
            if prompt[:common] != tokens:  # not an exact continuation: the common prefix
                common = 0
                limit = min(len(tokens), len(prompt))
                while common < limit and tokens[common] == prompt[common]:
                    common += 1
                del tokens[common:], mask[common:], logprobs[common:]
            context = prompt[common:]
            tokens += context
            mask += [0] * len(context)
            logprobs += [0.0] * len(context)
            tokens += completion
            mask += [1] * len(completion)
            logprobs += turn.completion_logprobs
            routing = None
            if turn.routed_experts:
                routing = decode_routed_experts(turn.routed_experts)[: len(tokens)]
        if routing is not None and len(routing) < len(tokens):
            pad = np.full((len(tokens) - len(routing), *routing.shape[1:]), -1, np.int16)
            routing = np.concatenate([routing, pad])
        return TrainingTokens(
            token_ids=tokens,
            loss_mask=mask,
            inference_logprobs=logprobs,
            temperature=self.sampled_temperature(),
            routing=routing,
        )

    def sampled_temperature(self) -> float:
        """The one temperature every turn's logprobs are of; ValueError when turns differ (a
        training sample carries one temperature)."""
        temperature = 1.0
        for i, turn in enumerate(self.turns):  # no set per rollout: the group processor asks
            current = logprob_temperature(turn.temperature)
            if i and current != temperature:
                temperatures = sorted({logprob_temperature(t.temperature) for t in self.turns})
                raise ValueError(
                    f"rollout {self.example_id}: turns sampled at different temperatures "
                    f"{temperatures}; a training sample has one"
                )
            temperature = current
        return temperature
