"""Kept HTTP connections a client never sends on once the server has closed them.

Both of rlkit's aiohttp clients keep connections alive between requests: the inference client
(`rlkit.inference.client`, vLLM's server and any OpenAI-compatible API) and the sandbox client
(`rlkit.sandbox.client`). A server closes an idle kept connection after its own keep-alive
timeout (vLLM's after 5 s), or drops all of them when it restarts; aiohttp's connector keeps
one for 15 s by default and looks only at its transport before reusing it, so a request sent
after the server's close and before the client's loop has read it goes to a dead connection
and fails ("Can not write request body", ServerDisconnectedError). `KeptConnector` looks first.
"""

from __future__ import annotations

import asyncio
import select

import aiohttp
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

# marks a connection's protocol once handed out: a mark, not a weak set, whose callbacks run at
# garbage collection, where a signal's KeyboardInterrupt (the launcher's SIGTERM) is swallowed
HANDED_OUT = "_rlkit_handed_out"


class KeptConnector(aiohttp.TCPConnector):
    """Never sends a request on a kept connection that the server has already closed.

    The client learns that the server closed a kept connection (it restarted, or dropped an idle
    one) only when its loop next reads that socket; aiohttp looks only at its transport, so a
    request sent before then goes to a dead connection and fails. That request is not retried: a
    POST (a sandbox's `/run`, a server's `/rlkit/update_weights`) is not idempotent, and the
    client cannot tell a request the closing peer never read from one the server received and
    then died on before its first answer byte (the same ServerDisconnectedError or reset, on a
    reused connection too), so RFC 9112 section 9.3.1 rules the retry out (aiohttp retries
    idempotent methods only). Instead the close is looked for before sending: an idle HTTP/1.1
    connection has nothing to read unless the peer closed or reset it, so a readable one is
    dropped for the next kept one or a new one (one poll a reuse). Left: a close landing between
    that poll and the send, which errors like a server dying mid-request.
    """

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        while True:
            conn = await super().connect(req, traces, timeout)
            kept = getattr(conn.protocol, HANDED_OUT, False)
            if kept and closed_by_peer(conn.transport):
                conn.close()  # then the next kept one, or a new one (never dropped)
                continue
            if conn.protocol is not None:
                setattr(conn.protocol, HANDED_OUT, True)
            return conn


def closed_by_peer(transport: asyncio.Transport | None) -> bool:
    """Whether an idle kept connection has something to read: the peer's close or reset."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False  # nothing to look at: aiohttp's own checks decide
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))
