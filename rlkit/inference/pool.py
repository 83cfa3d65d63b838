"""A pool of inference servers that keeps a run going while some of them are down.

`ClientPool.next()` hands each group a `PooledClient`: a view pinned to the next healthy server
in round-robin order, with the `InferenceClient` calls the environments make. When a request
fails and the server no longer answers `/health`, the pool marks it down (dropped from the round
robin) and the view retries the same request on another healthy server, so an in-flight rollout
survives the loss of its server. If no server is healthy the request waits up to
`recover_timeout_s` for one to come back, then raises `ServersLost` (kept in `lost`: rollouts
record the failure as an error, and the orchestrator stops the run with a resumable checkpoint).

`monitor()` (a task the orchestrator runs) polls the servers that are down; one that answers
again is first brought to the current policy version (`update_weights`'s last) through its
version's transport (`WeightTransport.catch_up`; when the transport cannot, as a broadcast
after the trainer moved on, it waits out of the round robin for the next update) and then
rejoins the round robin. Weight updates go to the healthy servers through the transport
(`WeightTransport.deliver`); a server that does not get one is dropped and catches up when it
rejoins. `counters` records failovers, drops and rejoins.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rlkit.errors import RunStopped
from rlkit.inference.admin import AdminClient
from rlkit.inference.client import RETRY_STATUS, Generation, InferenceClient, InferenceError
from rlkit.protocol.weights import PublishedVersion
from rlkit.weights import Outcome, transport_class

COUNTERS = ("failovers", "servers_dropped", "servers_rejoined")


async def load_adapters(servers: list[AdminClient], path: str, version: int) -> list[Outcome]:
    """Every server in `servers` loads this run's adapter at `path` as `version`."""
    results = await asyncio.gather(
        *(s.load_adapter(path, version) for s in servers), return_exceptions=True
    )
    outcomes = []
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, InferenceError):
            raise result
        failed = isinstance(result, InferenceError)
        outcomes.append(Outcome(not failed, error=str(result) if failed else ""))
    return outcomes


class ServersLost(InferenceError, RunStopped):
    """No inference server was healthy within the recovery timeout: the orchestrator stops the
    run with a resumable checkpoint (`--resume` once servers are back)."""


def _server_failure(exc: InferenceError) -> bool:
    """Whether a failed request may be the server's fault (no answer, or a transient status)."""
    return exc.status is None or exc.status in RETRY_STATUS


class ClientPool:
    """Round robin over the healthy servers of `urls`, with failover and rejoin (module doc)."""

    def __init__(
        self,
        urls: list[str],
        *,
        recover_timeout_s: float = 300.0,
        health_interval_s: float = 2.0,
        log: Callable[[str], None] = print,
        **client_kwargs: Any,
    ) -> None:
        if not urls:
            raise ValueError("ClientPool needs at least one server URL")
        self.clients = [InferenceClient(url, **client_kwargs) for url in urls]
        self.admins = [AdminClient(c) for c in self.clients]
        self.adapter: str | None = client_kwargs.get("adapter")  # a LoRA run's
        self.healthy = [True] * len(self.clients)
        self.recover_timeout_s = recover_timeout_s
        self.health_interval_s = health_interval_s
        self.log = log
        # (path, record, version) every server should serve; no record for a LoRA adapter
        self.current: tuple[str, PublishedVersion | None, int] | None = None
        self.waiting: set[int] = set()  # up, but out of the round robin until the next update
        self.not_ready: dict[int, str] = {}  # why a server that answers could not rejoin yet
        self.counters: Counter[str] = Counter()  # failovers, servers_dropped, servers_rejoined
        self.lost: ServersLost | None = None  # set once no server came back in time
        self._cycle = itertools.cycle(range(len(self.clients)))
        self._weights_lock = asyncio.Lock()

    @property
    def urls(self) -> list[str]:
        return [c.base_url for c in self.clients]

    def healthy_count(self) -> int:
        return sum(self.healthy)

    def update_seconds(self) -> dict[str, float]:
        """The last weight update's phases (`AdminClient.update_seconds`), each the slowest
        server's."""
        out: dict[str, float] = {}
        for admin in self.admins:
            for phase, seconds in admin.update_seconds.items():
                out[phase] = max(out.get(phase, 0.0), seconds)
        return out

    def metrics(self) -> dict[str, int]:
        """Healthy servers now and the run's failover counts so far (for the step record)."""
        return {
            "inference_servers_healthy": self.healthy_count(),
            **{f"inference_{name}": self.counters[name] for name in COUNTERS},
        }

    def next_index(self) -> int | None:
        """The next healthy server in round-robin order, or None when all are down."""
        for _ in range(len(self.clients)):
            i = next(self._cycle)
            if self.healthy[i]:
                return i
        return None

    def next(self) -> PooledClient:
        """A client for one group: pinned to the next healthy server, failing over when it dies."""
        i = self.next_index()
        return PooledClient(self, next(self._cycle) if i is None else i)

    def mark_down(self, i: int, reason: str) -> None:
        if self.healthy[i]:
            self.healthy[i] = False
            self.counters["servers_dropped"] += 1
            self.log(
                f"inference server {self.clients[i].base_url} is down ({reason[:200]}); "
                f"dropped from the round robin, {self.healthy_count()} left"
            )

    def _drop(self, i: int, reason: str) -> None:
        """Server `i` failed: out of the round robin, and no longer waiting for weights."""
        self.mark_down(i, reason)
        self.waiting.discard(i)

    def _back(self, i: int) -> None:
        """Server `i` serves the current weights again: back in the round robin."""
        self.waiting.discard(i)
        self.not_ready.pop(i, None)
        self.healthy[i] = True
        self.counters["servers_rejoined"] += 1
        self.log(
            f"inference server {self.clients[i].base_url} is back (policy version "
            f"{self.clients[i].policy_version}); rejoined the round robin, "
            f"{self.healthy_count()} healthy"
        )

    async def wait_any(self) -> int:
        """A healthy server's index, waiting up to `recover_timeout_s`; else `ServersLost`."""
        deadline = time.monotonic() + self.recover_timeout_s
        while (i := self.next_index()) is None:
            if self.lost is not None or time.monotonic() >= deadline:
                self.lost = self.lost or ServersLost(
                    f"no inference server healthy for {self.recover_timeout_s:.0f}s "
                    f"(inference.recover_timeout_s): {self.urls}"
                )
                raise self.lost
            await asyncio.sleep(min(0.5, self.health_interval_s))
        return i

    async def check_health(self) -> list[bool]:
        """Ask every server's /health now (no resync: for start-up and reporting)."""
        return list(await asyncio.gather(*(c.health() for c in self.clients)))

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> None:
        """Wait until every server is healthy, or raise InferenceError after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not all(health := await self.check_health()):
            if loop.time() >= deadline:
                down = [c.base_url for c, ok in zip(self.clients, health, strict=True) if not ok]
                raise InferenceError(f"inference servers not healthy after {timeout:.0f}s: {down}")
            await asyncio.sleep(interval)
        self.healthy = health

    async def update_weights(self, path: str, version: int) -> None:
        """Bring every healthy server, and those back up and waiting, to policy version
        `version` published in `path`: this run's LoRA adapter, or full weights through the
        transport named in the version's record (`rlkit.weights`). A server that does not get
        it is dropped until it rejoins. Waits for a server to come back (`wait_any`) when none
        took the update."""
        record = None if self.adapter else PublishedVersion.read(path)
        if not self.adapter and record is None:
            raise ValueError(f"{path}: no published version record")
        async with self._weights_lock:
            self.current = (path, record, version)
            for admin in self.admins:
                admin.update_seconds = {}
            servers = [i for i, ok in enumerate(self.healthy) if ok or i in self.waiting]
            admins = [self.admins[i] for i in servers]
            if record is None:
                outcomes = await load_adapters(admins, path, version)
            else:
                outcomes = await transport_class(record.transport).deliver(admins, path, record)
            for i, outcome in zip(servers, outcomes, strict=True):
                if not outcome.loaded:
                    self._drop(i, f"weight update failed: {outcome.error}")
                elif i in self.waiting:
                    self._back(i)
        if not any(self.healthy):
            await self.wait_any()  # the monitor brings a returning server to these weights

    async def unload_adapter(self) -> None:
        """A LoRA run that ends: unload its adapter from every healthy server (best effort)."""
        live = [a for a, ok in zip(self.admins, self.healthy, strict=True) if ok]
        results = await asyncio.gather(*(a.unload_adapter() for a in live), return_exceptions=True)
        for admin, result in zip(live, results, strict=True):
            if isinstance(result, InferenceError):
                self.log(f"could not unload the adapter from {admin.base_url}: {result}")

    async def _rejoin(self, i: int) -> None:
        """Bring a server that answers again to the current version, then use it again; when
        its transport cannot (the trainer moved on), it waits for the next update."""
        admin = self.admins[i]
        async with self._weights_lock:
            if i in self.waiting:
                return
            if self.current is None:  # no update yet: the server has the starting weights
                self._back(i)
                return
            path, record, version = self.current
            if admin.loaded_version(await admin.status()) != version:
                if record is None:
                    await admin.load_adapter(path, version)
                elif not await transport_class(record.transport).catch_up(admin, path, record):
                    self.waiting.add(i)
                    self.log(
                        f"inference server {admin.base_url} is back; it rejoins with the next "
                        f"weight update (now policy version {version})"
                    )
                    return
            self._back(i)

    async def monitor(self) -> None:
        """Forever: every `health_interval_s`, try to bring the servers that are down back."""
        while True:
            await asyncio.sleep(self.health_interval_s)
            for i, client in enumerate(self.clients):
                if self.healthy[i] or not await client.health():
                    continue
                try:
                    await self._rejoin(i)
                except InferenceError as exc:  # up but not ready yet: try again next round
                    if self.not_ready.get(i) != str(exc):  # said once per reason, not per round
                        self.not_ready[i] = str(exc)
                        self.log(f"inference server {client.base_url} not ready to rejoin: {exc}")

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))


class PooledClient:
    """The `InferenceClient` calls of one group, sent to its server or, if that one dies, to
    another healthy one (see the module docstring)."""

    def __init__(self, pool: ClientPool, index: int) -> None:
        self.pool = pool
        self.index = index

    @property
    def client(self) -> InferenceClient:
        return self.pool.clients[self.index]

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def policy_version(self) -> int | None:
        return self.client.policy_version

    @property
    def api_key(self) -> str | None:  # the verifiers bridge hands these to its workers
        return self.client.api_key

    @property
    def timeout(self) -> float:
        return self.client.timeout

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        while True:
            index, client = self.index, self.client
            try:
                return await getattr(client, name)(*args, **kwargs)
            except InferenceError as exc:
                if not _server_failure(exc) or await client.health():
                    raise  # the request's own failure (or a server that is up): not ours to fix
                await self._move_off(index, str(exc))

    async def fail_over(self, reason: str) -> bool:
        """A request sent by someone else (a verifiers bridge worker) to this group's server
        failed: when the server is down, drop it and move the group to a healthy one (True);
        False when it is up (the failure was the request's own)."""
        if await self.client.health():
            return False
        await self._move_off(self.index, reason)
        return True

    async def _move_off(self, index: int, reason: str) -> None:
        """Drop server `index` from the pool and pin this group to a healthy one."""
        self.pool.mark_down(index, reason)
        self.index = await self.pool.wait_any()
        self.pool.counters["failovers"] += 1

    async def chat(self, *args: Any, **kwargs: Any) -> Generation:
        return await self._call("chat", *args, **kwargs)

    async def completion(self, *args: Any, **kwargs: Any) -> Generation:
        return await self._call("completion", *args, **kwargs)

    async def completions(self, *args: Any, **kwargs: Any) -> list[Generation]:
        return await self._call("completions", *args, **kwargs)

    @property
    def routing(self) -> bool:
        return self.client.routing

    async def model_card(self, model: str) -> dict[str, Any] | None:
        return await self.client.model_card(model)

    async def supports_token_prompts(self, model: str) -> bool:
        return await self.client.supports_token_prompts(model)

    async def health(self) -> bool:
        return await self.client.health()
