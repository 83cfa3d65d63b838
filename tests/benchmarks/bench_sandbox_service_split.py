"""Where a warm `POST /run` of the sandbox service goes, hop by hop, each hop measured alone.

p50 milliseconds of:
- the machine's floor for one process hop: a byte written to another (already started, idle)
  process's pipe and echoed back, nothing else;
- the warm pool alone, in this process: a ready sandbox taken and run (the benchmark's program,
  and `pass`: the pipe round trip and the loader's own work);
- HTTP through one kept socket written by hand (the floor of this machine's loopback and of the
  service's HTTP stack): `GET /health` (no token), `GET /metrics` (token checked), `POST /run`;
- the same through a kept aiohttp session, and through rlkit's client (`call`, `run`).
Every hop back to back and after a 0.3 s idle gap (a sleeping process wakes slower on a VM);
the requests that run a program are always spaced so the pool refills. Then the CPU a warm
request costs, refill included: the service process's user and system time and this client's,
per request. Prints one JSON line.

    python tests/benchmarks/bench_sandbox_service_split.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlkit.sandbox import runner  # noqa: E402
from rlkit.sandbox.client import SandboxClient  # noqa: E402
from rlkit.sandbox.forkserver import ForkPool  # noqa: E402
from rlkit.sandbox.pool import Profile  # noqa: E402
from tests.helpers.sandbox_service import Service, sandbox_service  # noqa: E402

PROGRAM = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))"
STDIN = " ".join(str(i) for i in range(1000))
GAPS = (0.0, 0.3)
REFILL_GAP_S = 0.3  # a request that uses up a sandbox waits this long for its refill


async def p50_ms(hop: Callable[[], Awaitable[object]], runs: int, gap: float) -> float:
    times = []
    for _ in range(runs):
        await asyncio.sleep(gap)
        start = time.perf_counter()
        await hop()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


async def pipe_round_trip(runs: int, gap: float) -> float:
    """p50 ms of one byte to an idle echoing process and back (blocking: nothing else runs)."""
    echo = "import os\nwhile b := os.read(0, 1):\n    os.write(1, b)"
    pipe = subprocess.PIPE
    child = subprocess.Popen([sys.executable, "-c", echo], stdin=pipe, stdout=pipe, bufsize=0)
    assert child.stdin is not None and child.stdout is not None
    write, read = child.stdin.fileno(), child.stdout.fileno()

    async def hop() -> None:
        os.write(write, b"x")
        os.read(read, 1)

    try:
        await hop()  # the child has started
        return await p50_ms(hop, runs, gap)
    finally:
        child.stdin.close()
        child.wait(10)


async def pool_hops(runs: int, gap: float) -> dict[str, float]:
    pool = ForkPool(Profile(timeout=30.0, memory_mb=1024), 1, runner.active_backend())
    pool.fill()

    async def run(code: str, stdin: str) -> None:
        while not pool.ready:
            await asyncio.sleep(0.01)
        sandbox = await pool.take()
        assert sandbox is not None
        result = await sandbox.run(code, "python", stdin, {}, runner.limits(10.0, 512), 4096)
        assert result.status == "ok", result
        pool.fill()

    try:
        return {
            "pool_program": await p50_ms(lambda: run(PROGRAM, STDIN), runs, max(gap, 0.05)),
            "pool_pass": await p50_ms(lambda: run("pass", ""), runs, max(gap, 0.05)),
        }
    finally:
        await pool.close()


class RawHttp:
    """HTTP/1.1 on one kept socket, written and read by hand (blocking: nothing else runs)."""

    def __init__(self, svc: Service) -> None:
        host, port = svc.url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.token = svc.token
        self.sock = self._connect()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def request(self, method: str, path: str, body: bytes = b"", auth: bool = True) -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        if auth:
            head += f"Authorization: Bearer {self.token}\r\n"
        data = (head + "\r\n").encode() + body
        self.sock.sendall(data)
        answer = self.sock.recv(65536)
        if not answer:  # the service closed the idle connection: once more on a new one
            self.sock = self._connect()
            self.sock.sendall(data)
            answer = self.sock.recv(65536)
        while b"\r\n\r\n" not in answer:
            answer += self.sock.recv(65536)
        head_bytes, _, content = answer.partition(b"\r\n\r\n")
        assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes
        length = int(head_bytes.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(content) < length:
            content += self.sock.recv(65536)
        return content


async def http_hops(svc: Service, runs: int, gap: float, kept: aiohttp.ClientSession) -> dict:
    raw = RawHttp(svc)
    client = SandboxClient(svc.url, str(svc.token_file))
    run_gap = max(gap, REFILL_GAP_S)
    run_body = json.dumps({"code": PROGRAM, "stdin": STDIN}).encode()

    async def raw_request(method: str, path: str, body: bytes = b"", auth: bool = True) -> None:
        raw.request(method, path, body, auth)

    async def kept_request(method: str, path: str, body: dict | None = None) -> None:
        async with kept.request(method, svc.url + path, json=body) as answer:
            assert answer.status == 200
            await answer.read()

    hops: dict[str, tuple[Callable[[], Awaitable[object]], float]] = {
        "raw_get_health": (lambda: raw_request("GET", "/health", auth=False), gap),
        "raw_get_metrics": (lambda: raw_request("GET", "/metrics"), gap),
        "aiohttp_kept_get_metrics": (lambda: kept_request("GET", "/metrics"), gap),
        "client_call_metrics": (lambda: client.call("GET", "/metrics", None, 1.0), gap),
        "raw_post_run": (lambda: raw_request("POST", "/run", run_body), run_gap),
        "aiohttp_kept_post_run": (
            lambda: kept_request("POST", "/run", {"code": PROGRAM, "stdin": STDIN}),
            run_gap,
        ),
        "client_run": (lambda: client.run(PROGRAM, "python", STDIN, 10.0, 512, None), run_gap),
    }
    return {name: await p50_ms(hop, runs, spacing) for name, (hop, spacing) in hops.items()}


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def cpu_per_request(svc: Service, runs: int) -> dict[str, float]:
    """CPU milliseconds per warm `client.run`, its pool refill included (spaced to finish)."""
    client = SandboxClient(svc.url, str(svc.token_file))
    user, system = cpu_seconds(svc.proc.pid)
    mine = time.process_time()
    for _ in range(runs):
        await client.run(PROGRAM, "python", STDIN, 10.0, 512, None)
        await asyncio.sleep(REFILL_GAP_S)
    mine = time.process_time() - mine
    user_after, system_after = cpu_seconds(svc.proc.pid)
    return {
        "service_user": round((user_after - user) * 1000 / runs, 2),
        "service_system": round((system_after - system) * 1000 / runs, 2),
        "client": round(mine * 1000 / runs, 2),
    }


async def main(folder: Path, runs: int) -> dict:
    out: dict = {"runs": runs}
    for gap in GAPS:
        floor = await pipe_round_trip(runs, gap)
        out[f"gap_{gap}"] = {"pipe_round_trip": floor, **await pool_hops(runs, gap)}
    with sandbox_service(folder, "--pool-size", "4") as svc:
        await asyncio.sleep(3.0)  # the pool fills
        headers = {"Authorization": f"Bearer {svc.token}"}
        async with aiohttp.ClientSession(headers=headers) as kept:
            for gap in GAPS:
                out[f"gap_{gap}"].update(await http_hops(svc, runs, gap, kept))
        out["cpu_ms_per_warm_request"] = await cpu_per_request(svc, runs)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-split-") as folder:
        print(json.dumps(asyncio.run(main(Path(folder), args.runs))))
