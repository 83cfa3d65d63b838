"""The shared fake OpenAI-compatible server returns vLLM-shaped replies and injected failures."""

from __future__ import annotations

import asyncio

import pytest

from rlkit.inference import InferenceClient, InferenceError
from tests.helpers.fake_openai import FakeOpenAIServer


async def test_chat_and_completion_carry_token_ids_logprobs_usage() -> None:
    with FakeOpenAIServer() as server:
        async with InferenceClient(server.url) as client:
            assert await client.models() == ["fake-model"]
            chat = await client.chat([{"role": "user", "content": "abcdef"}], "fake-model")
            short = await client.chat(
                [{"role": "user", "content": "abcdef"}], "fake-model", {"max_tokens": 2}
            )
            text = await client.completion("xyz", "fake-model")
            ids = await client.completion([1, 2, 3], "fake-model")
    assert chat.text == "fedcba" and chat.finish_reason == "stop"
    assert chat.completion_token_ids == list(b"fedcba")
    assert len(chat.completion_logprobs) == 6 and all(lp < 0 for lp in chat.completion_logprobs)
    assert chat.prompt_token_ids and chat.usage["completion_tokens"] == 6
    assert short.text == "fe" and short.finish_reason == "length"
    assert text.text == "zyx" and text.prompt_token_ids == list(b"xyz")
    assert len(text.completion_logprobs) == 3
    assert ids.prompt_token_ids == [1, 2, 3]


async def test_lean_mode_serves_the_same_chat_replies() -> None:
    server = FakeOpenAIServer()
    serving = asyncio.create_task(server._serve_lean())
    try:
        async with InferenceClient(server.url) as client:
            assert await client.health() and await client.models() == ["fake-model"]
            chats = await asyncio.gather(
                *(client.chat([{"role": "user", "content": "abc"}], "fake-model") for _ in range(3))
            )
            with pytest.raises(InferenceError) as info:
                await client.completion("xyz", "fake-model")
    finally:
        serving.cancel()
    assert [c.text for c in chats] == ["cba"] * 3
    assert chats[0].completion_token_ids == list(b"cba") and len(chats[0].completion_logprobs) == 3
    assert info.value.status == 404  # lean mode serves chat only


async def test_scripted_failures_are_retried_or_raised() -> None:
    with FakeOpenAIServer(script=[429, 500, 200, 400]) as server:
        async with InferenceClient(server.url, backoff_s=0.01) as client:
            ok = await client.chat([{"role": "user", "content": "ab"}], "fake-model")
            with pytest.raises(InferenceError) as info:
                await client.chat([{"role": "user", "content": "ab"}], "fake-model")
    assert ok.text == "ba"
    assert info.value.status == 400
    assert server.stats == {429: 1, 500: 1, 200: 1, 400: 1}


async def test_responder_can_return_tool_calls() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    with FakeOpenAIServer(responder=lambda body: {"content": "", "tool_calls": [call]}) as server:
        async with InferenceClient(server.url) as client:
            gen = await client.chat([{"role": "user", "content": "hi"}], "fake-model")
    assert gen.finish_reason == "tool_calls"
    assert gen.message["tool_calls"] == [call]
    assert gen.completion_token_ids  # the call is tokenised like vLLM would
