"""How a multi-turn rollout sends each model turn: token ids (exact) or chat messages (fallback).

`TokenTurns` keeps the rollout's token sequence itself: the first prompt is rendered from the
messages, every later one is the previous prompt + the sampled completion ids + the environment's
reply rendered alone (`rlkit.envs.rendering`), sent as a token-id prompt to the completions API.
Before each request it checks the context: a prompt that leaves no room to generate ends the
rollout with `finish_reason = "context"` instead of an engine error.

`MessageTurns` sends the whole conversation as chat messages each turn; the server re-renders and
re-tokenises the history. It serves clients that cannot take token ids (remote APIs, scripted
clients, fake servers) and models whose tokenizer is not available locally.

`open_turns` picks one per rollout; `Rollout.prompt_mode` records which.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from rlkit.envs.rendering import ChatRenderer, load_renderer
from rlkit.inference import Generation, InferenceClient, InferenceError

log = logging.getLogger(__name__)
CONTEXT_ERROR = re.compile(r"maximum context length|context length", re.IGNORECASE)
_unrenderable: set[str] = set()  # tokenizer paths that failed to load: warned once, not retried


class ContextOverflow(Exception):
    """The next prompt leaves no room for a model turn."""


@dataclass
class _Turns:
    """What both ways of sending turns keep: where to send them, and how to sample."""

    client: InferenceClient
    model: str
    sampling: dict[str, Any]
    tools: list[dict[str, Any]] | None


@dataclass
class MessageTurns(_Turns):
    """Chat requests with the whole conversation (the server renders and tokenises it)."""

    mode = "messages"

    async def generate(self, messages: list[dict[str, Any]]) -> Generation:
        try:
            return await self.client.chat(
                messages, self.model, sampling=self.sampling, tools=self.tools
            )
        except InferenceError as exc:
            if exc.status == 400 and CONTEXT_ERROR.search(str(exc)):
                raise ContextOverflow(str(exc)) from exc
            raise

    def add_reply(self, reply: list[dict[str, Any]]) -> None:
        """Nothing to keep: the next request re-sends the messages."""


@dataclass
class TokenTurns(_Turns):
    """Completions requests whose prompt is the rollout's own token sequence."""

    mode = "tokens"
    renderer: ChatRenderer
    max_model_len: int | None
    prompt_ids: list[int] | None = None
    last: Generation | None = None

    def __post_init__(self) -> None:
        self.sampling = dict(self.sampling)  # popped below: the caller's dict stays as it was
        self.template_kwargs: dict[str, Any] = self.sampling.pop("chat_template_kwargs", None) or {}
        if "max_completion_tokens" in self.sampling:  # the chat API's name for max_tokens
            self.sampling["max_tokens"] = self.sampling.pop("max_completion_tokens")

    async def generate(self, messages: list[dict[str, Any]]) -> Generation:
        if self.prompt_ids is None:
            self.prompt_ids = self.renderer.prompt_ids(messages, self.tools, self.template_kwargs)
        prompt = self.prompt_ids
        if self.max_model_len is not None and len(prompt) >= self.max_model_len:
            raise ContextOverflow(
                f"the next prompt has {len(prompt)} tokens; max_model_len is {self.max_model_len}"
            )
        sampling = self.sampling
        if self.max_model_len is not None:  # vLLM refuses max_tokens beyond the context left
            room = self.max_model_len - len(prompt)
            sampling = {**sampling, "max_tokens": min(sampling.get("max_tokens") or room, room)}
        generation = await self.client.completion(prompt, self.model, sampling)
        if generation.prompt_token_ids and generation.prompt_token_ids != prompt:
            raise InferenceError("the server changed the token-id prompt it was sent")
        generation.prompt_token_ids = list(prompt)
        generation.text = self.renderer.decode(generation.completion_token_ids)
        total = len(prompt) + len(generation.completion_token_ids)
        if (
            generation.finish_reason == "length"
            and self.max_model_len is not None
            and total >= self.max_model_len
        ):
            generation.finish_reason = "context"
        self.last = generation
        return generation

    def add_reply(self, reply: list[dict[str, Any]]) -> None:
        """Extend the token sequence by the last completion and the environment's reply."""
        assert self.prompt_ids is not None and self.last is not None
        completion = self.last.completion_token_ids
        closed = bool(completion) and completion[-1] == self.renderer.eos_id
        self.prompt_ids = [
            *self.prompt_ids,
            *completion,
            *self.renderer.reply_ids(reply, self.tools, self.template_kwargs, closed=closed),
        ]


async def open_turns(
    client: InferenceClient,
    model: str,
    sampling: dict[str, Any],
    tools: list[dict[str, Any]] | None,
) -> TokenTurns | MessageTurns:
    """Token turns when the client takes token-id prompts and the model's tokenizer loads."""
    # InferenceClient probes its server; other clients (scripted ones) may state it as a bool
    probe = getattr(client, "supports_token_prompts", False)
    if await probe(model) if callable(probe) else probe:
        card = await client.model_card(model) or {}
        renderer = _renderer(str(card.get("root") or model))
        if renderer is not None:
            return TokenTurns(client, model, sampling, tools, renderer, card.get("max_model_len"))
    return MessageTurns(client, model, sampling, tools)


def _renderer(path: str) -> ChatRenderer | None:
    """`load_renderer(path)`, or None when it fails; a failed path is not retried per rollout."""
    if path in _unrenderable:
        return None
    try:
        return load_renderer(path)
    except Exception as exc:  # no local tokenizer, or a template that cannot render alone
        _unrenderable.add(path)
        log.warning("multi-turn rollouts use chat messages for %s: %s", path, exc)
        return None
