"""Tests on the session's vLLM servers (conftest `vllm_server`, `lora_server`) instead of servers
of their own: an engine start less each (docs/benchmarks.md, `bench_inference.py`). Only for
tests that neither kill, restart nor reconfigure the server; what they change (weights,
adapters) they put back, as the tests after them (and the next run's first step) expect."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlkit.inference import ServerProcess
from rlkit.inference.admin import AdminClient
from tests.helpers.published import published_link


async def serve_base(server: ServerProcess, model: Path) -> None:
    """`server` serves `model`'s own weights again, as version 0 (published beside the model:
    inside the session servers' weight roots)."""
    base = published_link(model, Path(tempfile.mkdtemp(dir=model.parent)) / "base")
    async with server.client() as client:
        await AdminClient(client).update_weights(str(base), version=0)


async def reset_lora_server(server: ServerProcess, model: Path) -> None:
    """A shared LoRA server as the next test expects it: `model`'s weights at version 0 and no
    adapter loaded."""
    await serve_base(server, model)
    async with server.client() as client:
        loaded = (await AdminClient(client).status())["adapters"]
    for name in loaded:
        async with server.client(adapter=name) as client:
            await AdminClient(client).unload_adapter()


@contextmanager
def on_session_server(server: ServerProcess, model: Path) -> Iterator[list[str]]:
    """The overrides pointing an `rlkit train` run of `model` (the served name is its path) at
    `server`, with its credential; afterwards `server` serves `model`'s own weights again,
    version 0 (the run trained them)."""
    try:
        yield [f'--inference.urls=["{server.url}"]', f"--inference.token_file={server.token_file}"]
    finally:
        asyncio.run(serve_base(server, model))
