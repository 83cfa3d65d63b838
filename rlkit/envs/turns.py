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

The G rollouts of a group start from the same prompt with the same sampling, so on the token
path their first turns are one request for G samples (`SharedFirstTurn`, set up for the group by
`group_first_turn` around `Environment.run_group`); later turns go one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlkit.envs.rendering import ChatRenderer, load_renderer
from rlkit.inference import Generation, InferenceClient, InferenceError

log = logging.getLogger(__name__)
CONTEXT_ERROR = re.compile(r"maximum context length|context length", re.IGNORECASE)
_unrenderable: set[str] = set()  # tokenizer paths that failed to load: warned once, not retried


class ContextOverflow(Exception):
    """The next prompt leaves no room for a model turn."""


class SharedFirstTurn:
    """The first turns of a group's `n` rollouts as one request with `n` samples.

    vLLM then prefills the prompt once and its API server parses, schedules and serialises one
    request instead of n: on CPU that per-request work cost more than the demo's 16-token
    completions. Each rollout takes one of the samples; the request is sent when the first one
    asks, and a rollout asking with another prompt (it never should) is refused.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.prompt: list[int] | None = None
        self.request: asyncio.Future[list[Generation]] | None = None
        self.taken = 0

    async def take(
        self, client: Any, prompt: list[int], model: str, sampling: dict[str, Any]
    ) -> Generation:
        if self.request is None:
            self.prompt = prompt
            self.request = asyncio.ensure_future(
                client.completions(prompt, model, sampling, n=self.n)
            )
            # rollouts cancelled mid-group (a purge) must not leave its failure unretrieved
            self.request.add_done_callback(lambda f: f.cancelled() or f.exception())
        if prompt != self.prompt or self.taken >= self.n:
            raise RuntimeError("a group's first turns must share one prompt, one per rollout")
        index, self.taken = self.taken, self.taken + 1
        return (await asyncio.shield(self.request))[index]


_GROUP_FIRST_TURN: contextvars.ContextVar[SharedFirstTurn | None] = contextvars.ContextVar(
    "rlkit_group_first_turn", default=None
)


@contextlib.contextmanager
def group_first_turn(n: int) -> Iterator[None]:
    """Rollouts started inside share their first turn (token path only) as one n-sample request."""
    token = _GROUP_FIRST_TURN.set(SharedFirstTurn(n) if n > 1 else None)
    try:
        yield
    finally:
        _GROUP_FIRST_TURN.reset(token)


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
    shared_first: SharedFirstTurn | None = None
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
        if self.last is None and self.shared_first is not None:
            generation = await self.shared_first.take(self.client, prompt, self.model, sampling)
        else:
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
    """Token turns when the client takes token-id prompts and the model's tokenizer loads.

    Inside `group_first_turn` the first turn is shared with the group's other rollouts, unless
    the sampling has a seed (n samples under one seed need not differ) or the client captures
    routing (R3 reads one completion per request).
    """
    # InferenceClient probes its server; other clients (scripted ones) may state it as a bool
    probe = getattr(client, "supports_token_prompts", False)
    if await probe(model) if callable(probe) else probe:
        card = await client.model_card(model) or {}
        renderer = _renderer(str(card.get("root") or model))
        if renderer is not None:
            shared = _GROUP_FIRST_TURN.get()
            if "seed" in sampling or getattr(client, "routing", False):
                shared = None
            max_model_len = card.get("max_model_len")
            return TokenTurns(client, model, sampling, tools, renderer, max_model_len, shared)
    return MessageTurns(client, model, sampling, tools)


def prepare_token_turns(model_path: str) -> None:
    """Load `model_path`'s renderer now instead of inside the first rollout, where loading the
    tokenizer (and importing transformers, seconds on a CPU machine) would stall the event loop.
    `rlkit train` calls it while its inference servers start; failures are the first rollout's
    to report, as before."""
    _renderer(model_path)


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
