"""The inference client's kept connections (`rlkit.connections.KeptConnector`): a request is never
sent on a connection the server has closed (a bench's weight update failed once with "Can not
write request body" after vLLM's server closed its idle connection), and an idle one is dropped
before vLLM's server would close it."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from rlkit.inference.client import KEEP_ALIVE_S, InferenceClient
from rlkit.ports import free_port
from tests.helpers.threaded_service import ThreadedService

VLLM_KEEP_ALIVE_S = 5.0  # vLLM's server: VLLM_HTTP_TIMEOUT_KEEP_ALIVE's default


def test_a_kept_connection_the_server_closed_is_not_used_for_the_next_request() -> None:
    peers: list[Any] = []

    async def answer(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.json_response({"policy_version": len(peers)})

    service = ThreadedService(free_port(), answer, path="/rlkit/update_weights")
    service.start()
    client = InferenceClient(f"http://127.0.0.1:{service.port}", max_retries=0)
    loop = asyncio.new_event_loop()

    def update() -> int:
        resp = loop.run_until_complete(client.request("POST", "/rlkit/update_weights", json={}))
        return resp.json()["policy_version"]

    try:
        assert (update(), update()) == (1, 2)
        service.stop()
        service.start()  # the same port, the client's loop idle meanwhile: its kept one is dead
        assert update() == 3
        assert peers[0] == peers[1] != peers[2]
        assert client._http().connector._keepalive_timeout == KEEP_ALIVE_S < VLLM_KEEP_ALIVE_S
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()
        service.close()
