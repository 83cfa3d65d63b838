"""The real rollout source: sampled prompts, G rollouts per group on the next server, scored.

Each group goes to `pool.next()` (round robin by group). When a group's generations fail
because a server went away, the group is not training data: the source waits (up to
`recover_timeout_s`) for the servers to be healthy again, brings a restarted server back to the
current policy weights, and reruns the group; after the timeout it raises a clear error that
stops the run. Environment or reward failures stay on their rollouts (`Rollout.error`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console

from rlkit.envs import load_environment
from rlkit.errors import UsageError
from rlkit.inference import ClientPool, InferenceError
from rlkit.orchestrator.config import EnvSpec
from rlkit.orchestrator.sampler import PromptSampler

GENERATION_FAILED = "generation failed"


class ServersLost(RuntimeError):
    """The inference servers did not come back within the recovery timeout."""


class EnvRolloutSource:
    """`RolloutSource` over real environments and an inference server pool."""

    def __init__(
        self,
        envs: dict[str, Any],
        sampler: PromptSampler,
        pool: ClientPool,
        model: str,
        sampling: dict[str, Any],
        group_size: int,
        *,
        recover_timeout_s: float,
        console: Console | None = None,
    ) -> None:
        self.envs = envs
        self.sampler = sampler
        self.pool = pool
        self.model = model
        self.sampling = sampling
        self.group_size = group_size
        self.recover_timeout_s = recover_timeout_s
        self.console = console or Console(stderr=True)
        self.weights: tuple[str, int] | None = None  # (path, version) the servers should serve
        self._recovering: asyncio.Lock | None = None

    async def next_group(self) -> tuple[str, int, list[Any]]:
        env_id, index = self.sampler.sample()
        env = self.envs[env_id]
        row = env.get_dataset()[index]
        while True:
            client = self.pool.next()
            rollouts = await env.run_group(row, client, self.model, self.sampling, self.group_size)
            if not all((r.error or "").startswith(GENERATION_FAILED) for r in rollouts):
                return env_id, index, rollouts
            if await client.health():  # the server is up: the failures are the rollouts' own
                return env_id, index, rollouts
            await self.recover()

    async def recover(self) -> None:
        """Wait for every server to be healthy and serve the current weights, or raise."""
        if self._recovering is None:
            self._recovering = asyncio.Lock()
        async with self._recovering:
            if all(await self.pool.check_health()):
                await self.resync()
                return
            self.console.print(
                f"[yellow]inference server down; waiting up to {self.recover_timeout_s:.0f}s[/]"
            )
            start = time.monotonic()
            try:
                await self.pool.wait_healthy(self.recover_timeout_s)
            except InferenceError as exc:
                raise ServersLost(f"{exc} (inference.recover_timeout_s)") from exc
            await self.resync()
            self.console.print(f"[green]inference back after {time.monotonic() - start:.0f}s[/]")

    async def resync(self) -> None:
        """Reload the latest weights on servers that restarted with older ones."""
        if self.weights is None:
            return
        path, version = self.weights
        for client in self.pool.clients:
            if (await client.status())["policy_version"] != version:
                await client.update_weights(path, version)

    async def update_weights(self, path: str, version: int) -> None:
        """Load new weights on every server (waiting out a server restart if needed)."""
        self.weights = (path, version)
        try:
            await self.pool.update_weights(path, version)
        except InferenceError:
            await self.recover()


def load_environments(specs: list[EnvSpec]) -> dict[str, Any]:
    """Load every environment up front; an unknown id is a UsageError naming `env.N.id`."""
    envs: dict[str, Any] = {}
    for i, spec in enumerate(specs):
        if spec.id in envs:
            raise UsageError(f"env.{i}.id: environment {spec.id!r} is listed twice")
        try:
            envs[spec.id] = load_environment(spec.id, verifiers_version=spec.verifiers, **spec.args)
        except UsageError as exc:
            raise UsageError(f"env.{i}.id: {exc}") from exc
        except TypeError as exc:
            raise UsageError(f"env.{i}.args: {exc}") from exc
        if envs[spec.id].dataset is None:  # never train on an evaluation set by accident
            raise UsageError(
                f"env.{i}.args: environment {spec.id!r} has no training set with these "
                "arguments (only evaluation rows); point it at training data"
            )
    return envs
