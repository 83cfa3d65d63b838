"""Client-side chat rendering for token-in/token-out turns.

After a multi-turn rollout's first turn, the next prompt is the previous prompt ids + the
sampled completion ids + the environment's reply rendered on its own: the chat template's text
for the new messages plus the assistant header. The history is never re-rendered, so a template
that renders earlier turns differently (Qwen3 drops the `<think>` of earlier turns) or a BPE that
would merge tokens across a turn boundary cannot change what the model is trained on.

The reply's text comes from rendering a fixed stub conversation (user, assistant) with and
without the reply and keeping what follows the stub's last end-of-turn marker, so it does not
depend on how the template renders the real history. `ChatRenderer.check()` verifies on a probe
conversation that prompt + completion + reply is what the template renders for the whole
conversation in the normal case (no reasoning to drop, no tokenisation involved).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Messages = list[dict[str, Any]]
# tokenizer classes AutoTokenizer resolves to TokenizersBackend itself for these model types
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")
GENERIC_TOKENIZER_MODELS = ("qwen2", "qwen3", "qwen3_moe")
STUB: Messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class RenderError(ValueError):
    """The chat template cannot render an environment reply on its own."""


class ChatRenderer:
    """Renders prompts and environment replies to token ids with a model's own chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.eos_token is None or tokenizer.chat_template is None:
            raise RenderError("the tokenizer needs an eos token and a chat template")
        self.tokenizer = tokenizer
        self.end_of_turn: str = tokenizer.eos_token
        self.eos_id: int = tokenizer.convert_tokens_to_ids(self.end_of_turn)

    def render(
        self,
        messages: Messages,
        tools: list[dict[str, Any]] | None,
        generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        """Completion text with markup tokens (`<think>`, `<tool_call>`) kept, end of turn cut."""
        if token_ids and token_ids[-1] == self.eos_id:
            token_ids = token_ids[:-1]
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def prompt_ids(
        self, messages: Messages, tools: list[dict[str, Any]] | None, template_kwargs: dict
    ) -> list[int]:
        """The first turn's prompt: the conversation so far plus the assistant header."""
        return self.encode(self.render(messages, tools, True, template_kwargs))

    def reply_text(
        self, reply: Messages, tools: list[dict[str, Any]] | None, template_kwargs: dict
    ) -> str:
        """What the template writes after an assistant turn's end-of-turn marker for `reply`."""
        base = self.render(STUB, tools, False, template_kwargs)
        full = self.render(STUB + reply, tools, True, template_kwargs)
        markers = base.count(self.end_of_turn)
        parts = full.split(self.end_of_turn, markers)
        if markers == 0 or len(parts) <= markers:
            raise RenderError(
                f"the chat template does not close the assistant turn with {self.end_of_turn!r}"
            )
        return parts[markers]

    def reply_ids(
        self,
        reply: Messages,
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict,
        *,
        closed: bool,
    ) -> list[int]:
        """Environment tokens between a sampled completion and the next model turn.

        `closed` says the completion ended with the end-of-turn token; otherwise (a stop string,
        another stop token) the marker is added here, as an environment token.
        """
        ids = self.encode(self.reply_text(reply, tools, template_kwargs))
        return ids if closed else [self.eos_id, *ids]

    def check(self, template_kwargs: dict | None = None) -> None:
        """Raise RenderError unless prompt + completion + reply renders the whole conversation."""
        kwargs = template_kwargs or {}
        history: Messages = [{"role": "user", "content": "What is 2 + 2?"}]
        answer = {"role": "assistant", "content": "It is 4."}
        reply: Messages = [{"role": "user", "content": "Are you sure?"}]
        pieces = (
            self.render(history, None, True, kwargs)
            + answer["content"]
            + self.end_of_turn
            + self.reply_text(reply, None, kwargs)
        )
        whole = self.render([*history, answer, *reply], None, True, kwargs)
        if pieces != whole:
            raise RenderError(
                "the chat template's reply rendered alone does not extend the conversation: "
                f"{pieces!r} != {whole!r}"
            )


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer AutoTokenizer would load, without its import cost where that is known.

    `from transformers import AutoTokenizer` imports torch and the model configs: about 4 s more
    on a CPU machine than the tokenizer class alone, paid by the launcher before anything starts
    and by every orchestrator and `rlkit eval`. A local Qwen-family checkpoint whose
    tokenizer_config names the generic class (every model rlkit builds or exports) gets exactly
    that class from AutoTokenizer, so it is loaded directly; anything else goes through
    AutoTokenizer's own resolution (specialised classes, remote code, hub ids).
    """
    directory = Path(path)
    try:
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        tokenizer_config, model_type = {}, None
    if (
        tokenizer_config.get("tokenizer_class") in GENERIC_TOKENIZERS
        and "auto_map" not in tokenizer_config
        and model_type in GENERIC_TOKENIZER_MODELS
    ):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.cache
def load_renderer(path: str) -> ChatRenderer:
    """The (checked) renderer of a local model directory or cached tokenizer; loaded once.

    transformers is imported here, not with the module: importing it takes seconds on a CPU
    machine, which every `import rlkit.envs` (the launcher before it starts vLLM, `rlkit eval`,
    the SFT data script) would otherwise pay whether or not it renders turns.
    """
    renderer = ChatRenderer(load_tokenizer(path))
    renderer.check()
    return renderer
