"""Sampling arguments: one config type and one precedence rule for `rlkit train` and `rlkit eval`.

The rule: environment `sampling_defaults` < config file < command-line flags. Each layer sets
only what it names; a field left unset (None) falls through to the layer below, so a run never
overrides an environment's `max_tokens` with a default nobody chose. `rlkit train` reads its
layers from `[orchestrator.sampling]` (dotted `--orchestrator.sampling.X` flags already land
there); `rlkit eval` from the package's `[tool.rlkit.eval.sampling]`, then -t/-T, then -S.

`logprob_temperature` is the temperature a sampled token's logprob is of: what a turn records
and the trainer divides its logits by.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from rlkit.config import Config, did_you_mean

# The other sampling arguments a request may carry, passed to the server as they are: the
# sampling fields of vLLM's chat completion request (a test keeps this a subset of them). A key
# outside them is a typo (`max_token`), refused with the closest name rather than sent and
# ignored.
SERVER_SAMPLING_ARGS = frozenset(
    {
        "allowed_token_ids",
        "bad_words",
        "chat_template_kwargs",
        "frequency_penalty",
        "ignore_eos",
        "include_stop_str_in_output",
        "length_penalty",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "min_p",
        "min_tokens",
        "n",
        "presence_penalty",
        "reasoning_effort",
        "repetition_penalty",
        "response_format",
        "seed",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop",
        "stop_token_ids",
        "structured_outputs",
        "thinking_token_budget",
        "top_k",
        "top_logprobs",
        "top_p",
        "truncate_prompt_tokens",
        "vllm_xargs",
    }
)


class SamplingConfig(Config):
    """Sampling arguments sent with every request; unset fields fall through (see module).

    Any other server sampling argument (top_p, top_k, seed, chat_template_kwargs, ...:
    `SERVER_SAMPLING_ARGS`) is passed to the server as is; an unknown key is an error.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    temperature: float | None = Field(
        None, ge=0, description="Sampling temperature (unset: the environment's, else 1)."
    )
    max_tokens: int | None = Field(
        None, gt=0, description="Max completion tokens per turn (unset: the environment's)."
    )

    @model_validator(mode="after")
    def _known_args(self) -> SamplingConfig:
        known = [*SERVER_SAMPLING_ARGS, *type(self).model_fields]
        for key in self.model_extra or {}:
            if key not in SERVER_SAMPLING_ARGS:
                raise ValueError(f"unknown sampling argument {key!r}{did_you_mean(key, known)}")
        return self

    def request_args(self) -> dict[str, Any]:
        """The fields this layer sets, as request arguments."""
        return self.model_dump(exclude_none=True)


SamplingLayer = SamplingConfig | Mapping[str, Any] | None


def resolve_sampling(*layers: SamplingLayer) -> dict[str, Any]:
    """The request's sampling arguments: later layers win, a None value sets nothing."""
    merged: dict[str, Any] = {}
    for layer in layers:
        args = layer.request_args() if isinstance(layer, SamplingConfig) else dict(layer or {})
        merged.update({key: value for key, value in args.items() if value is not None})
    return merged


def logprob_temperature(temperature: float | None) -> float:
    """The temperature the engine's logprobs of a turn are of: greedy (0) and unset count as 1
    (the engine then reports the untempered distribution)."""
    return float(temperature) if temperature else 1.0
