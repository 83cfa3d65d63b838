"""The admin client of one rlkit inference server: status, pause/resume, weights and adapters.

Kept apart from `InferenceClient` (the generation client environments use) because these calls
change what a server serves: only the orchestrator (and tests) make them. It shares the
generation client's connection pool, retries and credential.
"""

from __future__ import annotations

import time
from typing import Any

from rlkit.inference.client import InferenceClient


def update_seconds(response: dict[str, Any], call_s: float) -> dict[str, float]:
    """An update response's phases, flat: `server_<phase>` and `worker_<phase>` seconds and
    `call` (the request's round trip); `http` is the round trip less the server's phases."""
    out: dict[str, float] = {"call": call_s}
    for side in ("server", "worker"):
        for phase, seconds in (response.get(f"{side}_seconds") or {}).items():
            out[f"{side}_{phase}"] = float(seconds)
    server = sum(v for k, v in out.items() if k.startswith("server_"))
    if server:
        out["http"] = max(call_s - server, 0.0)
    return out


class AdminClient:
    """Admin calls to the server behind `client` (its adapter, if any, is this run's policy)."""

    def __init__(self, client: InferenceClient) -> None:
        self.client = client
        # the last weight update's phases (s): the server's `server_seconds` (record, pause,
        # workers, resume), its worker 0's `worker_seconds` (receive, verify, reload) and the
        # call's own round trip (`call`)
        self.update_seconds: dict[str, float] = {}

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
        t0 = time.perf_counter()
        resp = await self.client.request(
            "POST", "/rlkit/update_weights", retries=retries, json=body, **extra
        )
        data = resp.json()
        self.update_seconds = update_seconds(data, time.perf_counter() - t0)
        self.client.policy_version = int(data["policy_version"])
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
