"""A simulated pool of inference servers in virtual time (continuous batching, no tokens).

Each server decodes up to `max_seqs` sequences at once; one decode step advances every running
sequence by one token and takes `tick_base_s + tick_per_seq_s * running` seconds, so a lone
sequence decodes fast and a full batch gives the most tokens per second. Admitting a request
prefills its prompt, which pauses the server's decoding for `prefill_per_token_s * prompt`.
A weight update pauses every server for `update_s` (plus `update_per_seq_s` per sequence in
flight, as measured on vLLM CPU); requests in flight continue afterwards
under the new policy version (vLLM's `keep` mode), so a request records the version it started
and ended under, like the real client.

Nothing is simulated token by token: all running sequences of a server advance together, so
the server keeps one number, the tokens each running sequence has decoded so far (`progress`),
and a heap of the progress at which each request finishes. An event (admission, completion,
pause, cancellation) costs O(log n) and reschedules one timer: the next completion.

Losing a server sends its requests to the other servers (the real pool's failover retries
them from the start); a rejoining server loads the current weights (`update_s`) first.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque

from rlkit.sim.config import SimConfig

EPS = 1e-9


class Request:
    """One completion of `length` tokens; `done` resolves the group when its last one ends."""

    __slots__ = ("length", "finish", "start_version", "end_version", "group", "server", "state")

    def __init__(self, length: int, group: GroupWait) -> None:
        self.length = length
        self.finish = 0.0  # server progress at which it is done (set on admission)
        self.start_version = 0
        self.end_version = 0
        self.group = group
        self.server: SimServer | None = None
        self.state = 0  # 0 waiting, 1 running, 2 done, 3 cancelled


class GroupWait:
    """The future one group's source awaits: done when all of its requests are."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future, size: int) -> None:
        self.future = future
        self.left = size


class SimServer:
    """One inference server (module docstring)."""

    def __init__(self, index: int, pool: SimPool) -> None:
        self.index = index
        self.pool = pool
        self.loop = pool.loop
        s = pool.sim
        self.max_seqs, self.tick_base, self.tick_per_seq = (
            s.max_seqs,
            s.tick_base_s,
            s.tick_per_seq_s,
        )
        self.prefill_s = s.prefill_per_token_s * s.prompt_tokens
        self.heap: list[tuple[float, int, Request]] = []
        self.waiting: deque[Request] = deque()
        self.running = 0
        self.progress = 0.0
        self.t = 0.0  # when `progress` was last brought up to date
        self.paused_until = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.up = True
        self.version = 0
        self.busy_s = 0.0  # time decoding at least one sequence
        self.seq_s = 0.0  # integral of running sequences over time
        self.tokens = 0  # tokens of the completions it finished

    def advance(self, now: float) -> None:
        """Bring `progress` and the utilisation integrals up to `now`."""
        if self.running:
            start = self.t if self.t > self.paused_until else self.paused_until
            if now > start:
                dt = now - start
                self.progress += dt / (self.tick_base + self.tick_per_seq * self.running)
                self.busy_s += dt
                self.seq_s += dt * self.running
        self.t = now

    def submit(self, requests: list[Request]) -> None:
        now = self.loop.time()
        self.advance(now)
        for req in requests:
            req.server = self
            self.waiting.append(req)
        self._admit(now)
        self._schedule(now)

    def _admit(self, now: float) -> None:
        waiting = self.waiting
        while waiting and self.running < self.max_seqs:
            req = waiting.popleft()
            if req.state != 0:
                continue
            req.state = 1
            req.finish = self.progress + req.length
            req.start_version = self.version
            heapq.heappush(self.heap, (req.finish, next(self.pool.ids), req))
            self.running += 1
            if self.prefill_s:
                self.paused_until = (now if now > self.paused_until else self.paused_until) + (
                    self.prefill_s
                )

    def _schedule(self, now: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        heap = self.heap
        while heap and heap[0][2].state != 1:
            heapq.heappop(heap)
        if not heap or not self.up:
            return
        tick = self.tick_base + self.tick_per_seq * self.running
        start = now if now > self.paused_until else self.paused_until
        self.timer = self.loop.call_at(start + (heap[0][0] - self.progress) * tick, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        now = self.loop.time()
        self.advance(now)
        heap = self.heap
        limit = self.progress + EPS * (1.0 + self.progress)
        while heap and (heap[0][2].state != 1 or heap[0][0] <= limit):
            req = heapq.heappop(heap)[2]
            if req.state != 1:
                continue
            req.state = 2
            req.end_version = self.version
            self.running -= 1
            self.tokens += req.length
            group = req.group
            group.left -= 1
            if group.left == 0 and not group.future.done():
                group.future.set_result(None)
        self._admit(now)
        self._schedule(now)

    def cancel(self, requests: list[Request]) -> None:
        """Free the slots of a purged group's requests."""
        now = self.loop.time()
        self.advance(now)
        for req in requests:
            if req.state == 1:
                self.running -= 1
            if req.state < 2:
                req.state = 3
        self._admit(now)
        self._schedule(now)

    def pause(self, seconds: float, version: int) -> None:
        """A weight update: no decoding for `seconds`; what runs on ends under `version`."""
        now = self.loop.time()
        self.advance(now)
        self.paused_until = (now if now > self.paused_until else self.paused_until) + seconds
        self.version = version
        self._schedule(now)

    def take_requests(self) -> list[Request]:
        """The server goes down: every unfinished request leaves it (running first)."""
        now = self.loop.time()
        self.advance(now)
        self.up = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        running = sorted((r for _, _, r in self.heap if r.state == 1), key=lambda r: r.finish)
        left = running + [r for r in self.waiting if r.state == 0]
        self.heap, self.waiting, self.running = [], deque(), 0
        for req in left:
            req.state = 0
        return left


class SimPool:
    """N simulated servers, round robin per group over the ones that are up (like `ClientPool`)."""

    def __init__(self, servers: int, sim: SimConfig) -> None:
        self.loop = asyncio.get_running_loop()
        self.sim = sim
        self.ids = itertools.count()
        self.servers = [SimServer(i, self) for i in range(servers)]
        self.version = 0
        self.orphans: list[Request] = []  # requests waiting for any server to come back
        self._cycle = itertools.cycle(range(servers))
        self.failovers = 0

    def next_server(self) -> SimServer | None:
        for _ in range(len(self.servers)):
            server = self.servers[next(self._cycle)]
            if server.up:
                return server
        return None

    def submit(self, requests: list[Request]) -> None:
        server = self.next_server()
        if server is None:
            self.orphans += requests
        else:
            server.submit(requests)

    async def update_weights(self, version: int) -> None:
        """Every server that is up pauses (`update_s`, plus `update_per_seq_s` per sequence in
        flight) and serves `version`; the update is done when the slowest server is."""
        self.version = version
        longest = self.sim.update_s
        for server in self.servers:
            if server.up:
                pause = self.sim.update_s + self.sim.update_per_seq_s * server.running
                server.pause(pause, version)
                longest = max(longest, pause)
        await asyncio.sleep(longest)

    def lose(self, indices: list[int]) -> None:
        """Servers `indices` go down; their requests restart on the others."""
        moved: list[Request] = []
        for i in indices:
            moved += self.servers[i].take_requests()
        self.failovers += len(moved)
        for req in moved:
            self.submit([req])

    def rejoin(self, indices: list[int]) -> None:
        """Servers come back, load the current weights, and rejoin the round robin."""
        for i in indices:
            server = self.servers[i]
            server.up = True
            server.advance(self.loop.time())
            server.pause(self.sim.update_s, self.version)
        orphans, self.orphans = self.orphans, []
        for req in orphans:
            self.submit([req])

    def utilisation(self, elapsed_s: float) -> dict[str, float]:
        """Busy share (decoding anything) and slot occupancy (running / max_seqs) over the run."""
        now = self.loop.time()
        for server in self.servers:
            server.advance(now)
        n = len(self.servers)
        if elapsed_s <= 0 or n == 0:
            return {"engine_busy": 0.0, "engine_occupancy": 0.0, "generated_tokens": 0.0}
        return {
            "engine_busy": sum(s.busy_s for s in self.servers) / (n * elapsed_s),
            "engine_occupancy": sum(s.seq_s for s in self.servers)
            / (n * elapsed_s * self.sim.max_seqs),
            "generated_tokens": float(sum(s.tokens for s in self.servers)),
        }
