"""The rollout record shared by eval, training and the hub.

A `Rollout` is one conversation between a model and an environment: the chat messages, one
`Turn` per model call with the engine's exact token ids and logprobs, and the rubric's verdict.
It round-trips through JSON (`model_dump()` / `Rollout(**data)`), which is how eval runs store it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Turn(BaseModel):
    """One model call exactly as the engine saw and produced it."""

    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    completion_logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None
    policy_version_start: int | None = None
    policy_version_end: int | None = None


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

    def training_sample(self) -> tuple[list[int], list[int], list[float]]:
        """(token_ids, completion_mask, inference_logprobs) over the whole conversation.

        Model tokens get mask 1 and their engine logprob; prompt and environment tokens get mask
        0 and logprob 0.0. Each turn's prompt normally extends the previous turn's prompt +
        completion, so the turns concatenate into one sequence. When the chat template's
        re-tokenisation breaks that prefix property (a template that drops earlier reasoning, or
        a BPE that re-merges generated tokens differently), the sequence keeps the longest common
        prefix and continues with the later turn's prompt as context (mask 0): the result is
        always exactly the token sequence the engine saw for the last turn, and only tokens that
        are still in it keep their training signal.
        """
        tokens: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for turn in self.turns:
            prompt = turn.prompt_token_ids
            common = 0
            limit = min(len(tokens), len(prompt))
            while common < limit and tokens[common] == prompt[common]:
                common += 1
            del tokens[common:], mask[common:], logprobs[common:]
            context = prompt[common:]
            tokens += context
            mask += [0] * len(context)
            logprobs += [0.0] * len(context)
            tokens += turn.completion_token_ids
            mask += [1] * len(turn.completion_token_ids)
            lps = list(turn.completion_logprobs)
            if len(lps) != len(turn.completion_token_ids):
                raise ValueError(
                    f"rollout {self.example_id}: a turn has {len(turn.completion_token_ids)} "
                    f"completion tokens but {len(lps)} logprobs"
                )
            logprobs += lps
        return tokens, mask, logprobs
