"""Prompts that do not fit the model's context, found when the environments load.

A prompt fits when its tokens (rendered with the model's chat template, the environment's tool
schemas included, exactly as the first turn is sent) leave room for `max_tokens` completion
tokens within `max_model_len`. Without this check an over-long prompt only shows up as rollouts
without model tokens, one group at a time, until the no-signal watchdog stops the run.

`rlkit train` drops the rows that do not fit (one line per environment) or refuses to start when
more than `orchestrator.max_overlong_fraction` of an environment's rows do not; `rlkit eval`
warns; `rlkit env check --model` reports them as a failure.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.envs.environment import Environment
from rlkit.envs.group import EnvGroup
from rlkit.envs.rendering import ChatRenderer, load_renderer
from rlkit.envs.sampling import SamplingLayer
from rlkit.errors import UsageError
from rlkit.inference import InferenceClient

MAX_MODEL_LEN_FLAG = "--max-model-len"


@dataclass
class FitReport:
    """Prompt lengths of one environment's rows against the room the context leaves."""

    env_id: str
    lengths: list[int]  # first-turn prompt tokens of each row, in dataset order
    max_model_len: int
    max_tokens: int

    @property
    def limit(self) -> int:
        """The most prompt tokens that leave room for `max_tokens`."""
        return self.max_model_len - self.max_tokens

    @property
    def overlong(self) -> list[int]:
        """Indices of the rows whose prompt does not fit."""
        return [i for i, n in enumerate(self.lengths) if n > self.limit]

    @property
    def fitting(self) -> list[int]:
        return [i for i, n in enumerate(self.lengths) if n <= self.limit]

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)

    def over(self) -> str:
        """`longer than ... (longest prompt L tokens, ...)`: the numbers a user needs to act."""
        return (
            f"longer than max_model_len {self.max_model_len} - max_tokens {self.max_tokens} = "
            f"{self.limit} tokens (longest prompt {self.longest} tokens, chat template and tool "
            "schemas included)"
        )

    def describe(self) -> str:
        return (
            f"{len(self.overlong)} of {len(self.lengths)} prompts of {self.env_id} are "
            f"{self.over()}"
        )

    def fix(self, where: str = "inference.extra_args") -> str:
        return (
            f"raise the context ({where}: {MAX_MODEL_LEN_FLAG} "
            f"{self.longest + self.max_tokens} or more), lower max_tokens, or shorten the prompts"
        )


def max_model_len(extra_args: Sequence[str], model_path: str) -> int | None:
    """The context length the launched servers will use: `--max-model-len` from the vLLM
    arguments, else the model's `max_position_embeddings` (vLLM's default); None if unknown."""
    args = list(extra_args)
    for i, arg in enumerate(args):
        if arg == MAX_MODEL_LEN_FLAG and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(MAX_MODEL_LEN_FLAG + "="):
            value = arg.split("=", 1)[1]
        else:
            continue
        if not value.isdigit():
            raise UsageError(
                f"inference.extra_args: {MAX_MODEL_LEN_FLAG} must be a number of tokens, "
                f"got {value!r}"
            )
        return int(value)
    config = Path(model_path) / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        return int(value) if isinstance(value, int) else None
    return None


def served_context(urls: Sequence[str], model: str, api_key: str | None = None) -> int | None:
    """The `max_model_len` that the first answering server reports for `model` (vLLM's model
    card): what running servers (`--role orchestrator`) really use, whatever the config says."""

    async def ask(url: str) -> Any:
        async with InferenceClient(url, api_key=api_key, timeout=5.0, max_retries=0) as client:
            return ((await client.model_card(model)) or {}).get("max_model_len")

    for url in urls:
        value = asyncio.run(ask(url))
        if isinstance(value, int):
            return value
    return None


def renderer_for(model_path: str) -> ChatRenderer | None:
    """The model's chat renderer, or None when its tokenizer is not available here."""
    try:
        return load_renderer(model_path)
    except Exception:  # no local tokenizer (a remote model name) or an unusable template
        return None


def _tools(env: Environment, row: dict[str, Any]) -> list[dict[str, Any]] | None:
    target = env.member(row.get("info") or {}) if isinstance(env, EnvGroup) else env
    tools_for_request = getattr(target, "tools_for_request", None)
    return tools_for_request() if callable(tools_for_request) else None


def prompt_lengths(
    env: Environment,
    rows: Sequence[dict[str, Any]],
    renderer: ChatRenderer,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """First-turn prompt tokens of each row, as `TokenTurns` renders them."""
    kwargs = template_kwargs or {}
    texts = [renderer.render(row["prompt"], _tools(env, row), True, kwargs) for row in rows]
    if not texts:
        return []
    encoded = renderer.tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) for ids in encoded]


def measure(
    env: Environment,
    rows: Sequence[dict[str, Any]],
    renderer: ChatRenderer,
    max_model_len: int,
    sampling: SamplingLayer,
) -> FitReport:
    """The fit of `rows` under the environment's sampling merged with `sampling`."""
    merged = env.sampling_for(sampling)
    max_tokens = int(merged.get("max_tokens") or merged.get("max_completion_tokens") or 0)
    lengths = prompt_lengths(env, rows, renderer, merged.get("chat_template_kwargs"))
    return FitReport(env.env_id, lengths, max_model_len, max_tokens)


def fit_training_sets(
    envs: dict[str, Environment],
    renderer: ChatRenderer,
    max_model_len: int,
    sampling: SamplingLayer,
    max_fraction: float,
    log: Callable[[str], None],
) -> dict[str, FitReport]:
    """Drop the training rows whose prompt does not fit, one `log` line per environment that
    loses rows; raise UsageError (naming the lengths and the fix) when more than `max_fraction`
    of an environment's rows, or all of them, do not fit."""
    reports: dict[str, FitReport] = {}
    for env_id, env in envs.items():
        dataset = env.get_dataset()
        report = measure(env, dataset, renderer, max_model_len, sampling)
        reports[env_id] = report
        overlong = report.overlong
        if not overlong:
            continue
        if len(overlong) == len(report.lengths) or len(overlong) > max_fraction * len(dataset):
            raise UsageError(
                f"{report.describe()}; at most orchestrator.max_overlong_fraction = "
                f"{max_fraction:g} of them may be dropped: {report.fix()}"
            )
        env.dataset = dataset.select(report.fitting)  # the cached property, replaced
        log(f"{env_id}: dropped {len(overlong)} of {len(dataset)} training prompts {report.over()}")
    return reports


async def served_fit(
    env: Environment,
    rows: Sequence[dict[str, Any]],
    client: Any,
    model: str,
    sampling: SamplingLayer,
) -> FitReport | None:
    """The fit of `rows` on a served model, for `rlkit eval`: the context and the tokenizer
    come from the server's model card (vLLM reports both); None for other servers."""
    card = await client.model_card(model) or {}
    context = card.get("max_model_len")
    if context is None:
        return None
    renderer = renderer_for(str(card.get("root") or model))
    return None if renderer is None else measure(env, rows, renderer, int(context), sampling)
