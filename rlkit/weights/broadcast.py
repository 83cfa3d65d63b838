"""The ``broadcast`` weight transport: the trainer sends each version over a process group with
every engine worker of every participating server.

Why a group of its own: the trainer's ranks already share FSDP's default group and each vLLM
server its own, and the set of servers changes (one dies, one rejoins). So the trainer's
exporting rank hosts a `TCPStore` and opens a standalone group under its own store prefix: rank
0 is the trainer, ranks 1.. the engine workers. gloo on CPU, NCCL on CUDA (`new_group`): the
same code path, so CI exercises it. The group is kept across updates while the same worker
processes join (each reports the group it holds when it joins an update), and opened anew when
the membership changes or an update failed: its set-up, a rendezvous of every rank through the
store, is then paid once, not per update (`Sender.setup_s` / `transfer_s`).

The handshake, as typed messages on the store (`Channel`): the trainer publishes the version's
record with a `BroadcastDelivery` (its store's address, backend, timeout, bucket layout) and no
tensor files; the orchestrator, which decides who joins, announces the peers' labels
(`Peers`); each worker says which group it holds, the sender names the group of this update
(`GroupInfo`: the kept one, or a new one for 1 + len(peers) ranks) and sends. Afterwards the
orchestrator gives its verdict (`Verdict`): when a live server did not get a complete verified
update, the trainer writes the filesystem copy of the same version (`FilesReady`) and that
server loads it. Until its next update the trainer also writes that copy
on request (`Rejoin`) for a server that restarts in between: with one server, waiting for the
next update would never end, since no rollout, hence no next batch, can be made without a
server. After its next update starts, the trainer marks the version `Closed` and such a server
joins that update. Tensors travel packed into byte buckets of at most `bucket_mb` MiB (a larger
tensor, or one of 1 MiB or more, goes alone, sent from its own storage without a copy: most
bytes of a model), one broadcast per bucket, two in
flight on each side: the sender packs bucket n+1 into the second of two staging buffers while
bucket n is on the wire, and a worker posts the receive of bucket n+1 before it hands bucket n
on, so the wire never waits for a copy (the same async collectives on gloo and NCCL).

No hang, ever: every store wait and every collective has the timeout. While it receives, each
worker adds to a heartbeat counter; when a collective fails the sender names the peers whose
heartbeat stopped (killed, or stuck), and a worker whose collective fails names the trainer. A
worker that finished marks itself done first, so it is never blamed.

The file reads in the order of one update: the transport (`Broadcast`: the trainer's
`publish` / `published` / `settle`, a worker's `receive`, the orchestrator's `deliver` /
`catch_up`), the delivery record, the handshake (messages and `Channel`), then each side apart:
the orchestrator's calls, the trainer's `Sender`, a worker's `Receiver`, and the collectives.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from rich.markup import escape

from rlkit.errors import InferenceError
from rlkit.progress import make_console
from rlkit.protocol.credentials import rendezvous_secret, sign
from rlkit.protocol.weights import Named, PublishedVersion, TensorEntry, aligned
from rlkit.weights.filesystem import write_files
from rlkit.weights.transport import (
    TRANSPORTS,
    ModelFiles,
    Outcome,
    Reception,
    ServerAdmin,
    TimeoutParams,
    TransportSettings,
    load_files,
    outcome_of,
    params_as,
)

HEARTBEAT_S = 0.2  # receivers' heartbeat period; a peer silent for several of them is dead
FILES_DIR = "files"  # the filesystem copy of a broadcast version, inside its directory
console = make_console(stderr=True)


class BroadcastError(RuntimeError):
    """A broadcast update failed: a peer died, timed out, or never joined (named in the text)."""


@contextmanager
def failing_as(what: str | Callable[[], str]) -> Iterator[None]:
    """A RuntimeError inside (a store or collective failing) as a BroadcastError that says
    `what` failed (a callable: worked out only then, e.g. which peers went silent); a
    BroadcastError passes as it is."""
    try:
        yield
    except BroadcastError:
        raise
    except RuntimeError as exc:
        raise BroadcastError(f"{what() if callable(what) else what}: {exc}") from exc


class BroadcastParams(TimeoutParams):
    """`[inference.transfer_params]` of the ``broadcast`` transport."""

    bucket_mb: int = Field(
        64,
        ge=1,
        description="Most MiB sent per collective (a bigger tensor goes alone); two are in "
        "flight, so the sender's staging costs twice this.",
    )


# ---- the transport ---------------------------------------------------------------------------
@TRANSPORTS.register("broadcast", params=BroadcastParams)
class Broadcast:
    """The transport's three sides (module doc). The trainer's instance sends from a background
    thread: the orchestrator announces who joins only after it sees the version published, and
    writes the next batch only after every server has loaded it; the trainer's main thread must
    meanwhile go back to waiting for that batch, or the two would wait on each other. One update
    is in flight at a time (`publish` follows `settle`). Once an update settled, the thread keeps
    the gathered CPU tensors until the next one (one CPU copy of the policy on the exporting
    rank) to write the filesystem copy for a server that restarts in the meantime."""

    name: ClassVar[str] = "broadcast"
    carries_adapters: ClassVar[bool] = False  # full weights only

    def __init__(self, settings: TransportSettings, model_files: ModelFiles | None = None) -> None:
        self.params = params_as(BroadcastParams, settings)
        self.token = settings.token
        self.model_files = model_files
        secret = rendezvous_secret(settings.token) if settings.token else ""
        self.sender = Sender(settings.host, self.params.timeout_s, settings.device, secret)
        self.thread: threading.Thread | None = None
        self.settled = threading.Event()  # the update in flight reached every server, or failed
        self.stop = threading.Event()

    # the trainer's side, in order: publish, published (-> _update), settle
    def publish(
        self, tmp: Path, record: PublishedVersion, tensors: list[Named]
    ) -> PublishedVersion:
        self.settle()
        delivery = self.sender.delivery(tensors, self.params.bucket_mb * 2**20)
        return record.model_copy(update={"delivery": delivery.model_dump(mode="json")})

    def published(self, out: Path, record: PublishedVersion, tensors: list[Named]) -> None:
        self.thread = threading.Thread(
            target=self._update, args=(record, tensors, out), daemon=True, name="rlkit-broadcast"
        )
        self.thread.start()

    def _update(self, record: PublishedVersion, tensors: list[Named], out: Path) -> None:
        """The background thread of one update: send it, then write its filesystem copy when
        some server needs it; the version is closed for copies at the end."""
        channel = self.sender.channel(record.version)
        try:
            reason = self._send(record, tensors) or self._serve_rejoin(channel)
            if reason is not None:
                self._write_copy(channel, record, tensors, out, reason)
        finally:
            channel.put(Closed())
            self.settled.set()

    def _send(self, record: PublishedVersion, tensors: list[Named]) -> str | None:
        """Send the update and wait for the orchestrator's verdict; why a filesystem copy is
        needed (the broadcast failed, a server has no verified update), or None."""
        try:
            self.sender.send(record, tensors)
        except BroadcastError as exc:
            return str(exc)
        verdict = self.sender.channel(record.version).poll(Verdict, self.stop)
        if verdict is not None and verdict.files_needed:
            return "a server did not get a verified update"
        return None

    def _serve_rejoin(self, channel: Channel) -> str | None:
        """Every server has the update (it settled): until the next one, wait for a server
        that restarts and asks for this version; the reason to write the copy, or None."""
        self.settled.set()
        if channel.poll(Rejoin, self.stop) is not None:
            return "a server restarted and asks for it"
        return None

    def _write_copy(
        self,
        channel: Channel,
        record: PublishedVersion,
        tensors: list[Named],
        out: Path,
        reason: str,
    ) -> None:
        console.print(
            f"[yellow]broadcast of version {record.version}: {escape(reason[:500])}; "
            "writing its filesystem copy[/]"
        )
        path = write_files(out / FILES_DIR, record, tensors, self.model_files, self.token)
        channel.put(FilesReady(path=str(path)))

    def settle(self) -> None:
        """Let the update in flight settle (at most the timeout, then it is abandoned) and stop
        serving its filesystem copy on request."""
        if self.thread is None:
            return
        self.settled.wait(self.params.timeout_s)
        self.stop.set()
        self.thread.join()
        self.stop.clear()
        self.settled.clear()
        self.thread = None

    # an engine worker's side
    receiver: ClassVar[Receiver]  # this process's (set below the class `Receiver`)

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        """Every bucket, kept until the last has arrived: loading each as it lands would leave
        the model half-updated when a later bucket fails, and the server must keep its old
        version then. The memory cost (one copy of the weights) is the filesystem path's too.
        Each bucket's tensors are digested for the check while the next bucket is on the wire."""
        tensors: list[Named] = []
        for bucket in cls.receiver.receive(record, reception):
            reception.arrived(bucket)
            tensors += bucket
        return tensors

    # the orchestrator's side
    @classmethod
    async def deliver(
        cls, servers: list[ServerAdmin], directory: str, record: PublishedVersion
    ) -> list[Outcome]:
        """Every server's workers join the group; one that answers but did not get a complete
        verified update keeps its old version and then loads the trainer's filesystem copy."""
        outcomes, members, labels = await peers_of(servers)
        secret = run_secret(servers)
        await asyncio.to_thread(announce_peers, record, labels, secret)
        # transfer, verification and reload: each bounded by the broadcast timeout
        timeout = 3 * BroadcastDelivery.of(record).timeout_s
        results = await asyncio.gather(
            *(
                servers[i].update_weights(
                    directory, record.version, rank=rank, timeout=timeout, retries=0
                )
                for i, rank in members
            ),
            return_exceptions=True,
        )
        behind = []
        for (i, _), result in zip(members, results, strict=True):
            outcomes[i] = outcome_of(result)
            if outcomes[i].answered and not outcomes[i].loaded:
                behind.append(i)
        files = await asyncio.to_thread(finish_update, record, bool(behind), secret)
        if files is not None:
            loaded = await load_files([servers[i] for i in behind], files, record.version)
            for i, outcome in zip(behind, loaded, strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    @classmethod
    async def catch_up(cls, server: ServerAdmin, directory: str, record: PublishedVersion) -> bool:
        """The trainer's filesystem copy of the version, written on request; False when the
        trainer has moved on (the server joins its next update) or cannot be reached."""
        try:
            files = await asyncio.to_thread(request_files, record, run_secret([server]))
        except BroadcastError as exc:
            raise InferenceError(
                f"no filesystem copy of policy version {record.version}: {exc}"
            ) from exc
        if files is None:
            return False
        await server.update_weights(files, record.version)
        return True


# ---- the delivery record ---------------------------------------------------------------------
class BroadcastDelivery(BaseModel):
    """A broadcast version's delivery fields: how to join its group and unpack its buckets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: tuple[str, int]
    backend: str
    timeout_s: float
    buckets: list[tuple[int, int]]  # [start, end) index ranges over the record's tensors

    @classmethod
    def of(cls, record: PublishedVersion) -> BroadcastDelivery:
        return cls.model_validate(record.delivery)

    def bucket_size(self, tensors: list[TensorEntry], bucket: tuple[int, int]) -> int:
        """Bytes on the wire: every tensor at an aligned offset, the last one unpadded (a
        bucket of one tensor is exactly its bytes, sent from its own storage)."""
        entries = tensors[bucket[0] : bucket[1]]
        return sum(aligned(e.nbytes) for e in entries[:-1]) + entries[-1].nbytes

    def trainer(self) -> str:
        return f"the trainer (store {self.address[0]}:{self.address[1]})"


ALONE_BYTES = 2**20  # a tensor this large goes in a bucket alone: sent from its storage, no copy


def plan_buckets(
    tensors: list[Named], bucket_bytes: int, alone_bytes: int = ALONE_BYTES
) -> list[tuple[int, int]]:
    """[start, end) index ranges over `tensors` (in order), each at most `bucket_bytes` once
    packed, except that a tensor larger than that, or of at least `alone_bytes`, forms a bucket
    alone (the sender then broadcasts its own storage: packing the large tensors was a copy of
    nearly every byte on the sender's critical path, and its threads competed with the wire's)."""
    buckets: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, (_, tensor) in enumerate(tensors):
        n = aligned(tensor.numel() * tensor.element_size())
        alone = n >= alone_bytes
        if i > start and (size + n > bucket_bytes or alone):
            buckets.append((start, i))
            start, size = i, 0
        size += n
        if alone:
            buckets.append((start, i + 1))
            start, size = i + 1, 0
    if start < len(tensors):
        buckets.append((start, len(tensors)))
    return buckets


# ---- the handshake's messages ---------------------------------------------------------------
class Peers(BaseModel):
    """Orchestrator -> trainer: who joins; rank i + 1 is labels[i] (a server URL and worker)."""

    labels: list[str]


class GroupInfo(BaseModel):
    """Trainer -> workers: the process group this update uses (`id`, kept across updates while
    the same worker processes join) and its size."""

    id: int
    size: int


class Verdict(BaseModel):
    """Orchestrator -> trainer, once every server answered: does a server need the files?"""

    files_needed: bool


class Rejoin(BaseModel):
    """Orchestrator -> trainer: a server restarted between updates and needs this version."""


class FilesReady(BaseModel):
    """Trainer -> orchestrator: where the filesystem copy of the version is."""

    path: str


class Closed(BaseModel):
    """Trainer -> orchestrator: no filesystem copy of this version will be written any more."""


class Joined(BaseModel):
    """Worker -> trainer: it joins this update, holding group `held` (0: none)."""

    held: int


class Done(BaseModel):
    """Worker -> trainer: the last bucket arrived."""


M = TypeVar("M", bound=BaseModel)


class Channel:
    """The typed messages of one update on the trainer's store: each message kind has one key
    per version (and per worker for `Joined` / `Done`), made here and nowhere else.

    torch's store has no authentication and lists its keys to anyone who connects, so every
    value carries an HMAC under the run's rendezvous secret (`rlkit.protocol.credentials`,
    never in the store): a value planted by a process without the run's token is ignored, as
    if it were not there."""

    def __init__(self, store: dist.Store, version: int, secret: str) -> None:
        self.store = store
        self.version = version
        self.secret = secret

    def key(self, kind: type[BaseModel], who: int | None = None) -> str:
        base = f"{kind.__name__.lower()}-{self.version}"
        return base if who is None else f"{base}/{who}"

    def _mac(self, key: str, body: str) -> str:
        return sign(f"{key}\0{body}".encode(), self.secret)

    def put(self, message: BaseModel, who: int | None = None) -> None:
        key, body = self.key(type(message), who), message.model_dump_json()
        self.store.set(key, json.dumps({"body": body, "mac": self._mac(key, body)}))

    def peek(self, kind: type[M], who: int | None = None) -> M | None:
        """The message if a valid one is there now, else None (nothing, or a forgery)."""
        key = self.key(kind, who)
        if not self.store.check([key]):
            return None
        try:
            value = json.loads(self.store.get(key))
            body, mac = value["body"], value["mac"]
        except (ValueError, KeyError, TypeError):
            return None
        if not hmac.compare_digest(str(mac), self._mac(key, str(body))):
            return None
        return kind.model_validate_json(body)

    def has(self, kind: type[BaseModel], who: int | None = None) -> bool:
        return self.peek(kind, who) is not None

    def get(self, kind: type[M], who: int | None = None, timeout_s: float | None = None) -> M:
        """The message, waiting up to `timeout_s` (default: the store's timeout); RuntimeError
        when no valid one came."""
        wait_s = self.store.timeout.total_seconds() if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        key = self.key(kind, who)
        while (message := self.peek(kind, who)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no valid {key} within {wait_s:.0f}s")
            if not self.store.check([key]):  # not there yet: the store wakes us when it is
                try:
                    self.store.wait([key], timedelta(seconds=left))
                except RuntimeError:  # its timeout: checked above on the next turn
                    pass
                continue
            time.sleep(0.01)  # there but not valid (a forgery): until a valid one replaces it
        return message

    def without(self, kind: type[BaseModel], peers: list[str]) -> list[str]:
        """The peers (rank r is peers[r - 1]) that have not sent a valid `kind`, named."""
        return [
            f"rank {r} ({label})" for r, label in enumerate(peers, start=1) if not self.has(kind, r)
        ]

    def poll(self, kind: type[M], stop: threading.Event) -> M | None:
        """The message once it is set; None when `stop` is set first."""
        while not stop.is_set():
            if (message := self.peek(kind)) is not None:
                return message
            stop.wait(0.05)
        return None

    def update_prefix(self) -> str:
        """Where this update's heartbeat counters live (plain counters: they only name a
        silent peer in an error message)."""
        return f"update-{self.version}/"


def _connect(delivery: BroadcastDelivery) -> dist.TCPStore:
    host, port = delivery.address
    timeout = timedelta(seconds=delivery.timeout_s)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)


def _channel(record: PublishedVersion, secret: str) -> Channel:
    return Channel(_connect(BroadcastDelivery.of(record)), record.version, secret)


# ---- the orchestrator's side ----------------------------------------------------------------
async def peers_of(
    servers: list[ServerAdmin],
) -> tuple[list[Outcome | None], list[tuple[int, int]], list[str]]:
    """Who joins: each server's status says its workers. Returns the outcome of each server
    that gave none (the rest None), the members (server index, its first rank) and the label
    of every rank from 1."""
    statuses = await asyncio.gather(*(s.status() for s in servers), return_exceptions=True)
    outcomes: list[Outcome | None] = [None] * len(servers)
    members: list[tuple[int, int]] = []
    labels: list[str] = []
    for i, status in enumerate(statuses):
        if isinstance(status, InferenceError):
            outcomes[i] = Outcome(False, False, f"no status before the broadcast: {status}")
            continue
        if isinstance(status, BaseException):
            raise status
        members.append((i, 1 + len(labels)))
        url = servers[i].base_url
        labels += [f"{url} worker {w}" for w in range(int(status.get("workers", 1)))]
    return outcomes, members, labels


def run_secret(servers: list[ServerAdmin]) -> str:
    """The rendezvous secret of the run whose credential the admin clients call with."""
    token = next((s.token for s in servers if s.token), None)
    return rendezvous_secret(token) if token else ""


def announce_peers(record: PublishedVersion, labels: list[str], secret: str = "") -> None:
    """Tell the sender of `record` who joins. Called once per update by whoever picks them."""
    trainer = BroadcastDelivery.of(record).trainer()
    with failing_as(f"update {record.version}: cannot reach {trainer}"):
        _channel(record, secret).put(Peers(labels=labels))


def finish_update(record: PublishedVersion, files_needed: bool, secret: str = "") -> str | None:
    """The orchestrator's verdict once every server answered: None when all got the update,
    else ask the trainer for the filesystem copy of this version and wait for its path.
    BroadcastError when the trainer cannot be reached."""
    delivery = BroadcastDelivery.of(record)
    with failing_as(
        f"update {record.version}: {delivery.trainer()} did not provide the filesystem copy "
        f"within {delivery.timeout_s:.0f}s"
    ):
        channel = _channel(record, secret)
        channel.put(Verdict(files_needed=files_needed))
        return channel.get(FilesReady).path if files_needed else None


def request_files(record: PublishedVersion, secret: str = "") -> str | None:
    """A server rejoins between updates: ask the trainer for the filesystem copy of `record`'s
    version. Its path, or None when the trainer has closed that version (its next update is
    under way: the server joins that one). BroadcastError when the trainer cannot be reached or
    does not answer within the timeout."""
    delivery = BroadcastDelivery.of(record)
    with failing_as(f"update {record.version}: cannot reach {delivery.trainer()}"):
        channel = _channel(record, secret)
        channel.put(Rejoin())
        deadline = time.monotonic() + delivery.timeout_s
        while time.monotonic() < deadline:
            if (files := channel.peek(FilesReady)) is not None:
                return files.path
            if channel.has(Closed):
                return None
            time.sleep(0.05)
    raise BroadcastError(
        f"update {record.version}: {delivery.trainer()} did not write the filesystem copy "
        f"within {delivery.timeout_s:.0f}s"
    )


# ---- the trainer's side ---------------------------------------------------------------------
class Sender:
    """Hosts the store (for the life of the trainer) and sends updates."""

    def __init__(self, host: str, timeout_s: float, device: str = "cpu", secret: str = "") -> None:
        self.timeout = timedelta(seconds=timeout_s)
        # the store listens on `host` only (torch's own would take every interface): it gets
        # a socket bound here
        self.listener = socket.create_server((host, 0), backlog=1024)
        self.store = dist.TCPStore(
            host,
            self.listener.getsockname()[1],
            is_master=True,
            wait_for_workers=False,
            timeout=self.timeout,
            master_listen_fd=self.listener.fileno(),
        )
        self.address = (host, self.store.port)
        self.device = device
        self.secret = secret
        self.group: dist.ProcessGroup | None = None  # kept while the same peers join
        self.group_peers: list[str] = []
        self.group_id = 0
        self.setup_s = 0.0  # the last update's group set-up (0 when its group was kept)
        self.transfer_s = 0.0  # ... and its buckets, up to every peer's confirmation
        self.staging: list[torch.Tensor] = []  # two packing buffers, kept across updates

    def delivery(
        self, tensors: list[Named], bucket_bytes: int, alone_bytes: int = ALONE_BYTES
    ) -> BroadcastDelivery:
        return BroadcastDelivery(
            address=self.address,
            backend=backend_of(self.device),
            timeout_s=self.timeout.total_seconds(),
            buckets=plan_buckets(tensors, bucket_bytes, alone_bytes),
        )

    def channel(self, version: int) -> Channel:
        return Channel(self.store, version, self.secret)

    def send(self, record: PublishedVersion, tensors: list[Named]) -> list[str]:
        """Wait for the peers of `record`'s update, send every bucket; returns their labels.
        BroadcastError naming the peers that died, stalled or never joined."""
        channel = self.channel(record.version)
        peers = self._peers(channel)
        if not peers:
            return []
        t0 = time.perf_counter()
        group = self._group_for(channel, peers, BroadcastDelivery.of(record).backend)
        self.setup_s = time.perf_counter() - t0
        try:
            self._send_buckets(channel, peers, group, record, tensors)
            self._confirm(channel, peers)
        except BroadcastError:
            self.group = None  # broken: the next update opens a new one
            raise
        self.transfer_s = time.perf_counter() - t0 - self.setup_s
        return peers

    def _peers(self, channel: Channel) -> list[str]:
        """The labels the orchestrator announced for this update."""
        wait_s = self.timeout.total_seconds()
        with failing_as(
            f"update {channel.version}: nobody announced the peers within {wait_s:.0f}s"
        ):
            return channel.get(Peers).labels

    def _group_for(self, channel: Channel, peers: list[str], backend: str) -> dist.ProcessGroup:
        """The group of this update: the previous one when the same worker processes join
        (each reports the group it holds), else a new one (its set-up is a rendezvous of every
        rank through the store: what reusing saves). BroadcastError naming the peers that never
        joined."""

        def missing() -> str:
            return (
                f"update {channel.version}: peers never joined within "
                f"{self.timeout.total_seconds():.0f}s: "
                f"{', '.join(channel.without(Joined, peers)) or 'unknown'}"
            )

        with failing_as(missing):
            deadline = time.monotonic() + self.timeout.total_seconds()
            held = {
                channel.get(Joined, r, max(deadline - time.monotonic(), 0.0)).held
                for r in range(1, len(peers) + 1)
            }
            if self.group is not None and peers == self.group_peers and held == {self.group_id}:
                channel.put(GroupInfo(id=self.group_id, size=1 + len(peers)))
                return self.group
            self.group = None  # closes the old group's connections
            self.group_id += 1
            channel.put(GroupInfo(id=self.group_id, size=1 + len(peers)))
            group = new_group(
                self.store, group_prefix(self.group_id), 0, 1 + len(peers), self.timeout, backend
            )
            self.group, self.group_peers = group, peers
            return group

    def _send_buckets(
        self,
        channel: Channel,
        peers: list[str],
        group: dist.ProcessGroup,
        record: PublishedVersion,
        tensors: list[Named],
    ) -> None:
        """One broadcast per bucket, pipelined: bucket n+1 is packed (into the staging buffer
        bucket n-1 used, whose broadcast has completed) while bucket n is on the wire, then
        posted before bucket n is waited for. BroadcastError naming the peers whose heartbeat
        stopped."""
        delivery = BroadcastDelivery.of(record)
        n = len(delivery.buckets)
        # (bucket index, its pending work, its buffer: alive until sent), oldest first
        in_flight: list[tuple[int, object, torch.Tensor]] = []

        def failed(b: int) -> Callable[[], str]:
            def what() -> str:
                dead = self._silent_peers(channel, peers)
                return (
                    f"update {channel.version}: bucket {b + 1} of {n} failed; peer(s) not "
                    f"responding: {', '.join(dead) or 'none found'}"
                )

            return what

        for b, bucket in enumerate(delivery.buckets):
            buffer = self._pack(record, delivery, tensors, bucket, b % 2)
            with failing_as(failed(b)):
                in_flight.append((b, _start_broadcast(group, buffer, self.timeout), buffer))
            if len(in_flight) == 2:  # the older one's staging buffer is packed next
                done, work, _ = in_flight.pop(0)
                with failing_as(failed(done)):
                    _wait(work, self.timeout)
        for done, work, _ in in_flight:
            with failing_as(failed(done)):
                _wait(work, self.timeout)

    def _confirm(self, channel: Channel, peers: list[str]) -> None:
        """Wait for every peer to confirm the last bucket (a send can complete into a dead
        peer's socket buffer); BroadcastError naming those that did not."""

        def missing() -> str:
            return (
                f"update {channel.version}: peer(s) did not confirm the last bucket within "
                f"{self.timeout.total_seconds():.0f}s: {', '.join(channel.without(Done, peers))}"
            )

        deadline = time.monotonic() + self.timeout.total_seconds()
        with failing_as(missing):
            for r in range(1, len(peers) + 1):
                channel.get(Done, r, max(deadline - time.monotonic(), 0.0))

    def _pack(
        self,
        record: PublishedVersion,
        delivery: BroadcastDelivery,
        tensors: list[Named],
        bucket: tuple[int, int],
        slot: int,
    ) -> torch.Tensor:
        """The bucket's bytes as sent: a lone tensor's own storage (no copy) when it lives on
        the sending device, else packed into staging buffer `slot` (0 or 1)."""
        chunk = tensors[bucket[0] : bucket[1]]
        if len(chunk) == 1 and chunk[0][1].device == torch.device(self.device):
            return chunk[0][1].detach().contiguous().reshape(-1).view(torch.uint8)
        size = delivery.bucket_size(record.tensors, bucket)
        while len(self.staging) <= slot:
            self.staging.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        if self.staging[slot].numel() < size:
            self.staging[slot] = torch.empty(size, dtype=torch.uint8, device=self.device)
        buffer = self.staging[slot][:size]
        offset = 0
        for _, tensor in chunk:
            raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[offset : offset + raw.numel()].copy_(raw, non_blocking=True)
            offset += aligned(raw.numel())
        return buffer

    def _silent_peers(self, channel: Channel, peers: list[str]) -> list[str]:
        """Peers that are not done and whose heartbeat did not move for 5 periods."""
        keys = [f"{channel.update_prefix()}beat/{r}" for r in range(1, len(peers) + 1)]
        before = [self.store.add(k, 0) for k in keys]
        time.sleep(5 * HEARTBEAT_S)
        return [
            f"rank {r} ({peers[r - 1]})"
            for r, key, old in zip(range(1, len(peers) + 1), keys, before, strict=True)
            if self.store.add(key, 0) == old and not channel.has(Done, r)
        ]


# ---- an engine worker's side ----------------------------------------------------------------
class Deadline:
    """One receive's deadline, which every wait shares: the server's cap bounds the whole
    receive, whatever the record asks for, so a sender trickling its buckets cannot keep the
    engine paused longer."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def left(self) -> timedelta:
        """What remains; RuntimeError once it has passed."""
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"the update took longer than {self.timeout_s:.0f}s")
        return timedelta(seconds=remaining)


class Receiver:
    """A worker process's side: joins each update and keeps its group between updates, one per
    trainer store (`groups`: store address -> (group id, group)), dropped when it breaks."""

    def __init__(self) -> None:
        self.groups: dict[tuple, tuple[int, dist.ProcessGroup]] = {}

    def held(self, address: tuple) -> int:
        """The id of the group kept for the trainer store at `address` (0: none)."""
        return self.groups[address][0] if address in self.groups else 0

    def receive(self, record: PublishedVersion, reception: Reception) -> Iterator[list[Named]]:
        """Join the update as `reception.rank` and yield each bucket's (name, tensor) pairs as
        it arrives (views into the bucket's buffer: on this process's current CUDA device with
        NCCL, else on CPU). BroadcastError naming the trainer when it dies or stalls past the
        timeout."""
        delivery = BroadcastDelivery.of(record)
        delivery = delivery.model_copy(
            update={"timeout_s": min(delivery.timeout_s, reception.timeout_s)}
        )
        deadline = Deadline(delivery.timeout_s)
        address = tuple(delivery.address)
        trainer = f"the trainer (rank 0, store {delivery.address[0]}:{delivery.address[1]})"
        with failing_as(f"update {record.version}: cannot reach {trainer}"):
            channel = Channel(_connect(delivery), record.version, reception.secret)
            channel.put(Joined(held=self.held(address)), reception.rank)
            heartbeat = _Heartbeat(delivery, f"{channel.update_prefix()}beat/{reception.rank}")
        try:
            with failing_as(f"update {record.version}: joining the group with {trainer}"):
                group = self._group(channel, address, reception.rank, deadline, delivery.backend)
            n = len(delivery.buckets)
            posted = self._post(group, record, delivery, 0, deadline, trainer)
            for b in range(n):
                buffer, work = posted
                with failing_as(self._missing(record, b, n, delivery, trainer)):
                    _wait(work, deadline.left())
                if b + 1 < n:  # on the wire while this one is handed on
                    posted = self._post(group, record, delivery, b + 1, deadline, trainer)
                else:
                    channel.put(Done(), reception.rank)
                yield unpack(buffer, record.tensors, delivery.buckets[b])
        except BroadcastError:
            self.groups.pop(address, None)  # broken: the next update opens a new one
            raise
        finally:
            heartbeat.close()

    @staticmethod
    def _missing(
        record: PublishedVersion, b: int, n: int, delivery: BroadcastDelivery, trainer: str
    ) -> str:
        return (
            f"update {record.version}: bucket {b + 1} of {n} never arrived from {trainer} "
            f"within {delivery.timeout_s:.0f}s"
        )

    def _post(
        self,
        group: dist.ProcessGroup,
        record: PublishedVersion,
        delivery: BroadcastDelivery,
        b: int,
        deadline: Deadline,
        trainer: str,
    ) -> tuple[torch.Tensor, object]:
        """Bucket `b`'s receive posted into a new buffer (kept: every bucket is held until the
        last arrived); (buffer, pending work)."""
        n = len(delivery.buckets)
        with failing_as(self._missing(record, b, n, delivery, trainer)):
            device = f"cuda:{torch.cuda.current_device()}" if delivery.backend == "nccl" else "cpu"
            size = delivery.bucket_size(record.tensors, delivery.buckets[b])
            buffer = torch.empty(size, dtype=torch.uint8, device=device)
            return buffer, _start_broadcast(group, buffer, deadline.left())

    def _group(
        self, channel: Channel, address: tuple, rank: int, deadline: Deadline, backend: str
    ) -> dist.ProcessGroup:
        """The group the sender names for this update: the kept one, or a new one joined now."""
        info = channel.get(GroupInfo, timeout_s=deadline.left().total_seconds())
        if self.held(address) != info.id:
            self.groups.pop(address, None)
            group = new_group(
                channel.store, group_prefix(info.id), rank, info.size, deadline.left(), backend
            )
            self.groups[address] = (info.id, group)
        return self.groups[address][1]


def unpack(buffer: torch.Tensor, table: list[TensorEntry], bucket: tuple[int, int]) -> list[Named]:
    """A bucket's (name, tensor) pairs: views into `buffer`, laid out as the record's table."""
    out, offset = [], 0
    for entry in table[bucket[0] : bucket[1]]:
        view = buffer[offset : offset + entry.nbytes].view(getattr(torch, entry.dtype))
        out.append((entry.name, view.view(entry.shape)))
        offset += aligned(entry.nbytes)
    return out


class _Heartbeat:
    """A receiver's heartbeat: a counter in the store bumped every HEARTBEAT_S (own client)."""

    def __init__(self, delivery: BroadcastDelivery, key: str) -> None:
        self.store = _connect(delivery)
        self.key = key
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="rlkit-heartbeat")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.store.add(self.key, 1)
            except RuntimeError:  # the sender (store host) is gone: the collective reports it
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


Broadcast.receiver = Receiver()


def receive(record: PublishedVersion, reception: Reception) -> Iterator[list[Named]]:
    """This process's `Receiver.receive` (each bucket as it arrives)."""
    return Broadcast.receiver.receive(record, reception)


# ---- the collectives -------------------------------------------------------------------------
def backend_of(device: str) -> str:
    """NCCL when the buckets live on CUDA, else gloo."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def group_prefix(group_id: int) -> str:
    return f"group-{group_id}/"


def new_group(
    store: dist.Store, prefix: str, rank: int, world_size: int, timeout: timedelta, backend: str
) -> dist.ProcessGroup:
    """The standalone group of one update on `backend` (see `backend_of`)."""
    prefixed = dist.PrefixStore(prefix, store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def _start_broadcast(group: dist.ProcessGroup, buffer: torch.Tensor, timeout: timedelta) -> object:
    """Post the broadcast of `buffer` from rank 0 (async: gloo runs it on its own threads,
    NCCL on its stream); its pending work, for `_wait`."""
    return group.broadcast(buffer, 0, timeout)


def _wait(work: object, timeout: timedelta) -> None:
    """Wait for a posted broadcast, at most `timeout`; RuntimeError when it failed."""
    work.wait(timeout)  # type: ignore[attr-defined]
