"""Tests on the session's vLLM servers (conftest `vllm_server`, `lora_server`) instead of servers
of their own: an engine start less each (25-40 s on the 2-core CPU machine). Only for tests that
neither kill, restart nor reconfigure the server; what they change (weights, adapters) they put
back, as the tests after them (and the next run's first step) expect."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlkit.inference import InferenceClient, ServerProcess


async def _serve_base(url: str, model: Path) -> None:
    async with InferenceClient(url) as client:
        await client.update_weights(str(model), version=0)


async def reset_lora_server(url: str, model: Path) -> None:
    """A shared LoRA server as the next test expects it: `model`'s weights at version 0 and no
    adapter loaded."""
    await _serve_base(url, model)
    async with InferenceClient(url) as client:
        loaded = (await client.status())["adapters"]
    for name in loaded:
        async with InferenceClient(url, adapter=name) as client:
            await client.unload_adapter()


@contextmanager
def on_session_server(server: ServerProcess, model: Path) -> Iterator[str]:
    """The `--inference.urls` override naming `server`, for an `rlkit train` run of `model` (the
    served name is its path); afterwards `server` serves `model`'s own weights again, version 0
    (the run trained them)."""
    try:
        yield f'--inference.urls=["{server.url}"]'
    finally:
        asyncio.run(_serve_base(server.url, model))
