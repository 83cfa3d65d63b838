"""A pool of inference servers: round robin over healthy ones, weight updates to all."""

from __future__ import annotations

import asyncio
import itertools

from rlkit.inference.client import InferenceClient, InferenceError


class ClientPool:
    """Round-robin over several `InferenceClient`s, skipping servers that fail health checks."""

    def __init__(self, urls: list[str], **client_kwargs) -> None:
        if not urls:
            raise ValueError("ClientPool needs at least one server URL")
        self.clients = [InferenceClient(url, **client_kwargs) for url in urls]
        self.healthy = [True] * len(self.clients)
        self._cycle = itertools.cycle(range(len(self.clients)))

    def next(self) -> InferenceClient:
        """The next healthy client in round-robin order (any client if none is marked healthy)."""
        for _ in range(len(self.clients)):
            i = next(self._cycle)
            if self.healthy[i]:
                return self.clients[i]
        return self.clients[next(self._cycle)]

    async def check_health(self) -> list[bool]:
        """Refresh and return the health of every server."""
        self.healthy = list(await asyncio.gather(*(c.health() for c in self.clients)))
        return self.healthy

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> None:
        """Wait until every server is healthy, or raise InferenceError after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not all(await self.check_health()):
            if loop.time() >= deadline:
                down = [
                    c.base_url for c, ok in zip(self.clients, self.healthy, strict=True) if not ok
                ]
                raise InferenceError(f"inference servers not healthy after {timeout:.0f}s: {down}")
            await asyncio.sleep(interval)

    async def update_weights(self, path: str, version: int | None = None) -> list[int]:
        """Load new weights on every server; returns each server's new policy version."""
        return list(await asyncio.gather(*(c.update_weights(path, version) for c in self.clients)))

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))
