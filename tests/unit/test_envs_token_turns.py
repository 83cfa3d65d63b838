"""Token-in/token-out multi-turn rollouts: exact samples under a history-rewriting template.

The fake server plays vLLM with the tiny model's tokenizer (chat rendering, token-id prompts,
max_model_len); its chat template is Qwen3's behaviour in small: the `<think>` block of an
assistant turn before the last user message is dropped when the history is rendered again.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from rlkit.envs import MultiTurnEnv, Rollout, ToolEnv
from rlkit.envs.rendering import ChatRenderer, RenderError, load_tokenizer
from rlkit.eval.metrics import summarize
from rlkit.inference import InferenceClient
from rlkit.orchestrator.batching import GroupProcessor
from rlkit.orchestrator.prompts import Prompt
from rlkit.orchestrator.scheduler import Group
from tests.helpers.fake_openai import FakeOpenAIServer

DROPS_EARLIER_THINK = r"""{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{%- set content = message.content or '' %}
{%- if loop.index0 < ns.last_query and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""

QUESTIONS = Dataset.from_dict({"question": ["count to three"], "answer": ["3"]})


@pytest.fixture(scope="module")
def qwen_like_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer saved with the think-dropping template."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = DROPS_EARLIER_THINK
    out = tmp_path_factory.mktemp("qwen-like")
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(qwen_like_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen_like_dir)


class AgainEnv(MultiTurnEnv):
    """The user says 'again N' after each model turn; three model turns."""

    async def is_completed(self, messages, state) -> bool:
        return state["turn"] >= 3

    async def env_response(self, messages, state) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"again {state['turn']}"}]


def scripted(replies: list[str]) -> Callable[[dict[str, Any]], str]:
    """A responder giving `replies` in order (the last one again when they run out)."""
    count = itertools.count()
    return lambda body: replies[min(next(count), len(replies) - 1)]


THINKING = [f"<think>\nstep {i} of my reasoning\n</think>\n\nanswer {i}" for i in range(3)]


def fake(tokenizer: Any, root: Path, **kwargs: Any) -> FakeOpenAIServer:
    return FakeOpenAIServer(
        responder=kwargs.pop("responder", scripted(THINKING)),
        tokenizer=tokenizer,
        model_root=str(root),
        **kwargs,
    )


def segments(tokens: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask: [(mask, tokens), ...]."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(tokens, mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


async def test_token_path_sample_is_exactly_what_the_engine_sampled(
    tokenizer: Any, qwen_like_dir: Path
) -> None:
    env = AgainEnv(dataset=QUESTIONS, max_turns=5)
    with fake(tokenizer, qwen_like_dir) as server:
        async with InferenceClient(server.url) as client:
            rollout = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
        requests = list(server.requests)
    assert rollout.error is None and rollout.prompt_mode == "tokens"
    assert len(rollout.turns) == 3 and rollout.exact_continuation
    assert all(isinstance(r["prompt"], list) for r in requests)  # token ids, never messages

    sample = rollout.training_sample()
    tokens, mask, logprobs = sample.token_ids, sample.loss_mask, sample.inference_logprobs
    runs = segments(tokens, mask)
    assert [m for m, _ in runs] == [0, 1, 0, 1, 0, 1]
    eos = tokenizer.eos_token_id
    for i, turn in enumerate(rollout.turns):
        sampled = runs[2 * i + 1][1]
        assert sampled == turn.completion_token_ids and sampled[-1] == eos  # as sampled, + eos
        assert "<think>" in tokenizer.decode(sampled)  # earlier reasoning is still trained on
        if i:  # the environment's tokens: its reply rendered alone, then the assistant header
            env_text = tokenizer.decode(runs[2 * i][1])
            assert env_text == f"\n<|im_start|>user\nagain {i}<|im_end|>\n<|im_start|>assistant\n"
        assert turn.prompt_token_ids == tokens[: len(turn.prompt_token_ids)]
    # engine logprobs line up one to one with the masked-in tokens; zero elsewhere
    engine = [lp for turn in rollout.turns for lp in turn.completion_logprobs]
    assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == engine
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
    # no truncation: every sampled token is in the sample, once
    assert sum(mask) == sum(len(t.completion_token_ids) for t in rollout.turns)
    last = rollout.turns[-1]
    assert tokens == last.prompt_token_ids + last.completion_token_ids
    # the messages the environment and rubric see are the decoded completions
    assert rollout.completion[0]["content"].startswith("<think>\nstep")
    # eval records and shows the path
    assert Rollout(**rollout.model_dump()).prompt_mode == "tokens"
    assert summarize([rollout], 1)["prompt_modes"] == {"tokens": 1}


async def test_message_path_loses_the_earlier_reasoning(
    tokenizer: Any, qwen_like_dir: Path
) -> None:
    """The old path under the same template: the server re-renders, earlier turns truncate."""
    env = AgainEnv(dataset=QUESTIONS, max_turns=5)
    with fake(tokenizer, qwen_like_dir) as server:
        async with InferenceClient(server.url, token_prompts=False) as client:
            rollout = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
    assert rollout.prompt_mode == "messages" and not rollout.exact_continuation
    mask = rollout.training_sample().loss_mask
    assert sum(mask) == len(rollout.turns[-1].completion_token_ids)  # only the last turn is left


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def tool_call(a: int) -> str:
    call = json.dumps({"name": "add", "arguments": {"a": a, "b": 1}})
    return f"<think>\nI need a sum\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


async def test_tool_env_token_path_renders_tool_turns(tokenizer: Any, qwen_like_dir: Path) -> None:
    env = ToolEnv(tools=[add], dataset=QUESTIONS, max_turns=6)
    replies = scripted([tool_call(1), tool_call(2), "<think>\ndone\n</think>\n\nIt is 3."])
    with fake(tokenizer, qwen_like_dir, responder=replies) as server:
        async with InferenceClient(server.url) as client:
            rollout = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
    assert rollout.error is None and rollout.prompt_mode == "tokens" and rollout.exact_continuation
    assert [m["role"] for m in rollout.completion] == ["assistant", "tool"] * 2 + ["assistant"]
    assert [m["content"] for m in rollout.completion if m["role"] == "tool"] == ["2", "3"]
    sample = rollout.training_sample()
    runs = segments(sample.token_ids, sample.loss_mask)
    env_runs = [tokenizer.decode(t) for m, t in runs if m == 0][1:]
    assert env_runs == [
        f"\n<|im_start|>user\n<tool_response>\n{r}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        for r in ("2", "3")
    ]


async def test_context_overflow_ends_the_rollout_without_an_engine_error(
    tokenizer: Any, qwen_like_dir: Path
) -> None:
    env = AgainEnv(dataset=QUESTIONS, max_turns=5)
    for token_prompts in (None, False):  # token path: checked before sending; messages: the 400
        with fake(tokenizer, qwen_like_dir, max_model_len=40) as server:
            async with InferenceClient(server.url, token_prompts=token_prompts) as client:
                rollout = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
            rejected = server.stats[400]
        assert rollout.error is None and rollout.finish_reason == "context"
        assert 1 <= len(rollout.turns) < 3
        assert rejected == (0 if token_prompts is None else 1)


async def test_a_first_prompt_over_the_context_errors_with_the_lengths(
    tokenizer: Any, qwen_like_dir: Path
) -> None:
    """Nothing was generated, so nothing can be trained on: the error says `context` and the
    lengths (the batch would otherwise only report "rollout has no model tokens")."""
    env = AgainEnv(dataset=QUESTIONS, max_turns=5)
    with fake(tokenizer, qwen_like_dir, max_model_len=4) as server:
        async with InferenceClient(server.url) as client:
            rollout = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
    assert rollout.finish_reason == "context" and rollout.turns == []
    assert rollout.error is not None and rollout.error.startswith("context: the next prompt has")
    assert "max_model_len is 4" in rollout.error


async def test_clients_without_token_prompts_use_messages() -> None:
    env = AgainEnv(dataset=QUESTIONS, max_turns=2)
    with FakeOpenAIServer() as server:  # a remote API: no max_model_len in its model list
        async with InferenceClient(server.url) as client:
            assert not await client.supports_token_prompts("fake-model")
            rollout = await env.rollout(env.get_dataset()[0], client, "fake-model", {})
        assert all("messages" in body for body in server.requests)
    assert rollout.prompt_mode == "messages" and rollout.error is None


def test_reply_rendered_alone_matches_the_whole_conversation(tiny_model_dir: Path) -> None:
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    renderer.check()
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "1+2?"}]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    reply = [{"role": "tool", "tool_call_id": "c", "name": "add", "content": "3"}]
    pieces = (
        renderer.render(history, tools, True, {})
        + call
        + renderer.end_of_turn
        + renderer.reply_text(reply, tools, {})
    )
    whole = renderer.render(
        [*history, {"role": "assistant", "content": call}, *reply], tools, True, {}
    )
    assert pieces == whole
    assert renderer.reply_ids(reply, tools, {}, closed=False)[0] == renderer.eos_id


def test_a_template_without_end_of_turn_markers_is_refused(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}{{ m.content }}\n{% endfor %}"
    with pytest.raises(RenderError, match="does not close the assistant turn"):
        ChatRenderer(tok).check()


def test_step_metrics_count_exact_continuations_and_turns() -> None:
    def rollout(prompts: list[list[int]], mode: str, finish: str = "stop") -> Rollout:
        turns = [
            {"prompt_token_ids": p, "completion_token_ids": [9], "completion_logprobs": [-1.0]}
            for p in prompts
        ]
        return Rollout(turns=turns, prompt_mode=mode, finish_reason=finish, reward=len(prompts))

    group = Group(
        prompt=Prompt(0, "e", -1, -1),
        start_version=0,
        rollouts=[
            rollout([[1], [1, 9, 2]], "tokens"),
            rollout([[1], [1, 9, 2], [1, 9, 2, 9, 3]], "tokens", "context"),
            rollout([[1, 5], [1, 6]], "messages"),  # re-rendered history diverged
        ],
    )
    processor = GroupProcessor(advantage="grpo", drop_zero_advantage=False, solve_threshold=1.0)
    processor(group)
    stats = processor.take_stats()
    assert (stats.rollouts, stats.turns, stats.exact_continuations) == (3, 7, 2)
    assert (stats.token_prompts, stats.context_ended) == (2, 1)


async def test_a_groups_first_turns_are_one_request_with_n_samples(
    tokenizer: Any, qwen_like_dir: Path
) -> None:
    """`run_group` (what the orchestrator calls): the G first turns share their prompt, so they
    are one request for G samples; each rollout continues alone with its own sample."""
    env = AgainEnv(dataset=QUESTIONS, max_turns=5)
    count = itertools.count()
    with fake(tokenizer, qwen_like_dir, responder=lambda body: f"reply {next(count)}") as server:
        async with InferenceClient(server.url) as client:
            rollouts = await env.run_group(env.get_dataset()[0], client, "fake-model", {}, 4)
            requests = list(server.requests)
            server.requests.clear()
            seeded = await env.run_group(env.get_dataset()[0], client, "fake-model", {"seed": 1}, 4)
            seeded_requests = list(server.requests)
    assert [r.get("n") for r in requests] == [4] + [None] * 8  # one shared turn, then 2 x 4 alone
    assert all(r.error is None and r.exact_continuation and len(r.turns) == 3 for r in rollouts)
    firsts = [r.turns[0] for r in rollouts]
    assert len({tuple(t.completion_token_ids) for t in firsts}) == 4  # four different samples
    assert len({tuple(t.prompt_token_ids) for t in firsts}) == 1
    for rollout in rollouts:  # usage is each rollout's own, as if its turns went alone
        generated = sum(len(t.completion_token_ids) for t in rollout.turns)
        assert rollout.usage["completion_tokens"] == generated
        first = rollout.turns[0]
        assert rollout.completion[0]["content"] == tokenizer.decode(
            first.completion_token_ids, skip_special_tokens=True
        )
    # a seeded sampling asks n samples of one seed: not shared, each turn goes alone
    assert len(seeded_requests) == 12 and all("n" not in r for r in seeded_requests)
    assert all(r.error is None for r in seeded)


def test_prepare_token_turns_loads_the_renderer_before_any_rollout(
    qwen_like_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rlkit.envs.rendering import load_renderer
    from rlkit.envs.turns import prepare_token_turns

    load_renderer.cache_clear()
    prepare_token_turns(str(qwen_like_dir))
    assert load_renderer.cache_info().currsize == 1  # the first rollout finds it loaded
    prepare_token_turns(str(tmp_path / "no-model"))  # not raised: rollouts fall back to messages
    assert "use chat messages" in caplog.text


def test_load_tokenizer_is_what_autotokenizer_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    direct, auto = (
        load_tokenizer(str(tiny_model_dir)),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    assert type(direct) is type(auto)
    messages = [{"role": "user", "content": "Is \\frac{1}{2} < 0.6? héllo"}]
    text = auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert direct.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    assert direct(text)["input_ids"] == auto(text)["input_ids"]
    assert (direct.eos_token_id, direct.pad_token_id) == (auto.eos_token_id, auto.pad_token_id)
    # a checkpoint naming a specialised class goes through AutoTokenizer's own resolution
    named = tmp_path / "named"
    shutil.copytree(tiny_model_dir, named)
    config = json.loads((named / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    (named / "tokenizer_config.json").write_text(json.dumps(config))
    assert type(load_tokenizer(str(named))).__name__ == "Qwen2Tokenizer"
