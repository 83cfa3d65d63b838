"""The admin client of one rlkit inference server: status, pause/resume, weights and adapters.

Kept apart from `InferenceClient` (the generation client environments use) because these calls
change what a server serves: only the orchestrator (and tests) make them. It shares the
generation client's connection pool, retries and credential.
"""

from __future__ import annotations

from typing import Any

from rlkit.inference.client import InferenceClient


class AdminClient:
    """Admin calls to the server behind `client` (its adapter, if any, is this run's policy)."""

    def __init__(self, client: InferenceClient) -> None:
        self.client = client

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def token(self) -> str | None:
        """The credential this client calls with (the run's)."""
        return self.client.api_key

    @property
    def adapter(self) -> str | None:
        return self.client.adapter

    async def health(self) -> bool:
        return await self.client.health()

    async def status(self) -> dict[str, Any]:
        data = (await self.client.request("GET", "/rlkit/status")).json()
        self.client.policy_version = self.loaded_version(data)
        return data

    def loaded_version(self, status: dict[str, Any]) -> int | None:
        """The version of this run's policy (its adapter's, or the weights') in `status`."""
        if self.adapter is None:
            return int(status["policy_version"])
        version = (status.get("adapters") or {}).get(self.adapter)
        return None if version is None else int(version)

    async def pause(self, mode: str = "keep") -> None:
        """Pause generation; with `keep` in-flight requests freeze and continue on resume."""
        await self.client.request("POST", "/rlkit/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self.client.request("POST", "/rlkit/resume")

    async def update_weights(
        self,
        path: str,
        version: int | None = None,
        *,
        rank: int = 0,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> int:
        """Load the version published in `path` (any transport; `rank`: this server's first
        worker's rank in a broadcast group); returns the new policy version. `timeout` bounds
        the whole call (a server whose engine died mid-update may never answer)."""
        body: dict[str, Any] = {"path": str(path), "rank": rank}
        if version is not None:
            body["version"] = version
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        resp = await self.client.request(
            "POST", "/rlkit/update_weights", retries=retries, json=body, **extra
        )
        self.client.policy_version = int(resp.json()["policy_version"])
        return self.client.policy_version

    async def load_adapter(self, path: str, version: int) -> int:
        """Load the PEFT adapter at `path` as this run's adapter (in place); its version."""
        if self.adapter is None:
            raise ValueError("load_adapter needs a client created with adapter=NAME")
        body = {"name": self.adapter, "path": str(path), "version": version}
        resp = await self.client.request("POST", "/rlkit/load_adapter", json=body)
        self.client.policy_version = int(resp.json()["policy_version"])
        return self.client.policy_version

    async def unload_adapter(self) -> None:
        """Unload this run's adapter from the server (a run that ends frees its slot)."""
        await self.client.request("POST", "/rlkit/unload_adapter", json={"name": self.adapter})
