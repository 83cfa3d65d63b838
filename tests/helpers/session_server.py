"""`rlkit train` runs on the session's vLLM server (conftest `vllm_server`) instead of one of their
own: an engine start less per run (25-40 s on the 2-core CPU machine). Only for runs that
neither kill, restart nor reconfigure their server; a run trains the server's weights, so on
leaving, the server serves the base model again at policy version 0, as the tests after it
(and the next run's first step) expect."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlkit.inference import InferenceClient, ServerProcess


async def _serve_base(url: str, model: Path) -> None:
    async with InferenceClient(url) as client:
        await client.update_weights(str(model), version=0)


@contextmanager
def on_session_server(server: ServerProcess, model: Path) -> Iterator[str]:
    """The `--inference.urls` override naming `server`, which must serve `model` (its path is
    the served name); afterwards `server` serves `model`'s own weights again, version 0."""
    try:
        yield f'--inference.urls=["{server.url}"]'
    finally:
        asyncio.run(_serve_base(server.url, model))
