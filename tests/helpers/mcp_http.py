"""A real MCP server reached by URL (the `mcp` SDK's streamable HTTP transport), run as a
subprocess on a loopback port and stopped by its own pid.

Its tools: `add` (two integers), `nap` (sleeps, for timeouts), `whoami` (the request's
`X-Api-Key` header, to see headers from environment variables arrive) and `count` (a counter
kept per MCP session, to see that no state crosses rollouts).

    with mcp_http_server() as server:
        server.url        # http://127.0.0.1:PORT/mcp
        server.stop()     # kill it (a server lost mid-rollout); server.start() brings it back

Run standalone with ``python tests/helpers/mcp_http.py PORT [--json]`` (``--json``: plain JSON
replies instead of an SSE stream).
"""

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rlkit.ports import free_port

START_TIMEOUT_S = 30.0


class MCPHttpServer:
    """The server subprocess on one fixed port, so a restart keeps its URL."""

    def __init__(self, json_response: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.json_response = json_response
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, __file__, str(self.port)]
        command += ["--json"] if self.json_response else []
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"MCP server exited: {self.proc.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("MCP server did not come up") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def mcp_http_server(json_response: bool = False) -> Iterator[MCPHttpServer]:
    server = MCPHttpServer(json_response)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def serve(port: int, json_response: bool) -> None:
    # no `from __future__ import annotations` in this module: the SDK reads `ctx: Context`
    from mcp.server.mcpserver import Context, MCPServer

    app = MCPServer("rlkit-test", log_level="WARNING")
    counts: dict[str, int] = {}

    @app.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @app.tool()
    async def nap(seconds: float) -> str:
        """Sleep, then say so."""
        await asyncio.sleep(seconds)
        return "awake"

    @app.tool()
    def whoami(ctx: Context) -> str:
        """The X-Api-Key header of this request."""
        return (ctx.headers or {}).get("x-api-key", "nobody")

    @app.tool()
    def count(ctx: Context) -> str:
        """How many times this MCP session called count."""
        session = (ctx.headers or {}).get("mcp-session-id", "")
        counts[session] = counts.get(session, 0) + 1
        return str(counts[session])

    app.run("streamable-http", host="127.0.0.1", port=port, json_response=json_response)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    serve(args.port, args.json)
