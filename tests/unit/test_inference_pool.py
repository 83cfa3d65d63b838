"""The server pool keeps requests going when a server dies: failover, drop, rejoin, give up.

Servers are the shared fake OpenAI server run as separate processes, so that one can be killed
(SIGKILL) with a request in flight, as a crashed or unplugged inference node would be.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rlkit.errors import RunStopped
from rlkit.inference import InferenceError, free_port
from rlkit.inference.pool import ClientPool, ServersLost
from tests.helpers.cli import ROOT
from tests.helpers.fake_openai import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "abc"}]


class FakeServerProcess:
    """`python -m tests.helpers.fake_openai` on a fixed port, killable and restartable."""

    def __init__(self, latency: float = 0.0, port: int | None = None) -> None:
        self.port = port or free_port()
        self.latency = latency
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeServerProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.fake_openai",
                f"--port={self.port}",
                f"--latency={self.latency}",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # the URL: the socket is bound and uvicorn is starting
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def servers() -> Iterator[list[FakeServerProcess]]:
    started = [FakeServerProcess(latency=3.0).start(), FakeServerProcess().start()]
    try:
        yield started
    finally:
        for server in started:
            server.kill()


def make_pool(urls: list[str], messages: list[str], **kwargs) -> ClientPool:
    return ClientPool(
        urls, max_retries=1, backoff_s=0.05, health_interval_s=0.2, log=messages.append, **kwargs
    )


async def test_in_flight_request_fails_over_and_server_rejoins(
    servers: list[FakeServerProcess],
) -> None:
    slow, fast = servers
    log: list[str] = []
    pool = make_pool([slow.url, fast.url], log)
    try:
        await pool.wait_healthy(timeout=20, interval=0.1)
        client = pool.next()
        assert client.base_url == slow.url
        request = asyncio.create_task(client.chat(MESSAGES, "fake-model"))
        await asyncio.sleep(1.0)  # the slow server holds the request
        slow.kill()
        generation = await asyncio.wait_for(request, timeout=30)
        assert generation.text == "cba"  # answered by the other server
        assert client.base_url == fast.url
        assert pool.healthy == [False, True]
        assert pool.metrics() == {
            "inference_servers_healthy": 1,
            "inference_failovers": 1,
            "inference_servers_dropped": 1,
            "inference_servers_rejoined": 0,
        }
        assert {pool.next().base_url for _ in range(4)} == {fast.url}  # dropped from the rotation
        assert any(slow.url in line and "dropped" in line for line in log)

        monitor = asyncio.create_task(pool.monitor())
        try:
            await asyncio.sleep(0.5)
            assert pool.healthy == [False, True]  # still down: not rejoined
            servers[0] = FakeServerProcess(latency=0.0, port=slow.port).start()
            for _ in range(100):
                if all(pool.healthy):
                    break
                await asyncio.sleep(0.1)
            assert pool.healthy == [True, True]
            assert pool.metrics()["inference_servers_rejoined"] == 1
            assert {pool.next().base_url for _ in range(4)} == {slow.url, fast.url}
            assert any(slow.url in line and "rejoined" in line for line in log)
        finally:
            monitor.cancel()
    finally:
        await pool.aclose()


async def test_all_servers_down_gives_up_after_recover_timeout(
    servers: list[FakeServerProcess],
) -> None:
    log: list[str] = []
    pool = make_pool([s.url for s in servers], log, recover_timeout_s=1.0)
    try:
        await pool.wait_healthy(timeout=20, interval=0.1)
        for server in servers:
            server.kill()
        with pytest.raises(ServersLost, match="no inference server healthy for 1s"):
            await pool.next().chat(MESSAGES, "fake-model")
        assert isinstance(pool.lost, ServersLost)
        assert isinstance(pool.lost, RunStopped)  # the CLI's one-line error, exit code 1
        assert pool.healthy == [False, False]
        with pytest.raises(ServersLost):  # once lost, every later request fails at once
            await pool.next().completion("abc", "fake-model")
    finally:
        await pool.aclose()


async def test_errors_from_a_server_that_is_up_are_not_failed_over() -> None:
    """A server answering /health but failing requests (overloaded, a bad request) keeps its
    place: its errors are the request's, and the rollout records them."""
    with FakeOpenAIServer(fail_rate=1.0, fail_statuses=[500]) as failing, FakeOpenAIServer() as ok:
        urls = [failing.url.removesuffix("/v1"), ok.url.removesuffix("/v1")]
        pool = make_pool(urls, [])
        try:
            await pool.wait_healthy(timeout=20, interval=0.1)
            with pytest.raises(InferenceError) as err:
                await pool.next().chat(MESSAGES, "fake-model")
            assert err.value.status == 500
            assert pool.healthy == [True, True]
            assert pool.counters["failovers"] == 0
        finally:
            await pool.aclose()


async def test_a_server_not_ready_to_rejoin_is_reported_once_per_reason(
    servers: list[FakeServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that answers but cannot rejoin (e.g. it refuses the version: another run's
    credential) is tried every round; the log says why once, and again only when that changes."""
    log: list[str] = []
    pool = make_pool([servers[1].url], log)
    reasons = ["HTTP 403: not signed with this server's credential"]

    async def refuse(i: int) -> None:
        raise InferenceError(reasons[-1])

    monkeypatch.setattr(pool, "_rejoin", refuse)
    try:
        await pool.wait_healthy(timeout=20, interval=0.1)
        pool.healthy[0] = False
        monitor = asyncio.create_task(pool.monitor())
        try:
            await asyncio.sleep(1.0)  # ~5 rounds
            reasons.append("HTTP 503: engine paused")
            await asyncio.sleep(1.0)
        finally:
            monitor.cancel()
        said = [line for line in log if "not ready to rejoin" in line]
        assert [line.rsplit(": ", 1)[1] for line in said] == [
            "not signed with this server's credential",
            "engine paused",
        ]
    finally:
        await pool.aclose()


def test_an_updates_phases_are_the_slowest_servers() -> None:
    """The step record's `weight_update_<phase>_s` come from each server's answer: its phases
    flat, the HTTP round trip beyond them, and over servers the slowest one's per phase."""
    from rlkit.inference.admin import update_seconds

    one = update_seconds(
        {
            "server_seconds": {"record": 0.001, "pause": 0.004, "workers": 0.02, "resume": 0.001},
            "worker_seconds": {"receive": 0.002, "verify": 0.001, "load": 0.015},
        },
        call_s=0.03,
    )
    assert one["server_workers"] == 0.02 and one["worker_load"] == 0.015
    assert one["http"] == pytest.approx(0.03 - 0.026)
    assert update_seconds({}, call_s=0.01) == {"call": 0.01}  # an older server: no phases
    pool = ClientPool(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    pool.admins[0].update_seconds = one
    pool.admins[1].update_seconds = {**one, "server_pause": 0.05, "http": 0.0}
    phases = pool.update_seconds()
    assert phases["server_pause"] == 0.05 and phases["http"] == one["http"]
