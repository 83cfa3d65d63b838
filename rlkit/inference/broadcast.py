"""The ``broadcast`` weight transfer: the trainer sends each policy version over a process group
that it opens for that one update with every engine worker of every participating server.

Why a group of its own per update: the trainer's ranks already share FSDP's default group and
each vLLM server its own, and the set of servers changes (one dies, one rejoins). So the
trainer's exporting rank hosts a `TCPStore`, and each update N is a fresh standalone group
under the store prefix ``update-N``: rank 0 is the trainer, ranks 1.. the engine workers.
gloo on CPU, NCCL on CUDA (`new_group`): the same code path, so CI exercises it.

The handshake: the trainer publishes a manifest (`make_manifest`: tensor names, dtypes and
shapes in send order, the bucket layout, the store's address) beside the fingerprint and the
canary under ``weights/step_N``; whoever decides who joins (the orchestrator) writes the peers'
labels under the store key ``peers-N`` (`announce_peers`); the sender then opens the group for
1 + len(peers) ranks and each receiver joins with its rank. Afterwards the orchestrator gives its
verdict (`finish_update`): when a live server did not get a complete verified update, the
trainer writes the filesystem copy of the same version (`Sender.serve_files`) and that server
loads it the usual way. Until its next update the trainer also writes that copy on request for a
server that restarts in between (`request_files`): with one server, waiting for the next update
would never end, since no rollout, hence no next batch, can be made without a server. After its
next update starts, the trainer marks the version closed and such a server joins that update.
Tensors travel packed into byte
buckets of at most ``bucket_bytes`` (a larger tensor goes alone), one broadcast per bucket.

No hang, ever: every store wait and every collective has the manifest's timeout. While it
receives, each receiver adds to a heartbeat counter in the store; when a collective fails the
sender names the peers whose heartbeat stopped (killed, or stuck), and a receiver whose
collective fails names the trainer. A receiver that finished marks itself done first, so it is
never blamed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MANIFEST_FILE = "rlkit_broadcast.json"
ALIGN = 64  # byte offset of every tensor in a bucket: any dtype may view it in place
HEARTBEAT_S = 0.2  # receivers' heartbeat period; a peer silent for several of them is dead
Named = tuple[str, torch.Tensor]


class BroadcastError(RuntimeError):
    """A broadcast update failed: a peer died, timed out, or never joined (named in the text)."""


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def plan_buckets(tensors: list[Named], bucket_bytes: int) -> list[list[int]]:
    """[start, end) index ranges over `tensors` (in order), each at most `bucket_bytes` once
    packed, except that a tensor larger than that forms a bucket alone."""
    buckets: list[list[int]] = []
    start, size = 0, 0
    for i, (_, tensor) in enumerate(tensors):
        n = _aligned(tensor.numel() * tensor.element_size())
        if i > start and size + n > bucket_bytes:
            buckets.append([start, i])
            start, size = i, 0
        size += n
    if tensors:
        buckets.append([start, len(tensors)])
    return buckets


def make_manifest(
    version: int,
    tensors: list[Named],
    bucket_bytes: int,
    address: tuple[str, int],
    timeout_s: float,
    backend: str = "gloo",
) -> dict:
    """What receivers need to join update `version` and unpack its buckets."""
    return {
        "version": version,
        "backend": backend,
        "address": list(address),
        "timeout_s": timeout_s,
        "tensors": [
            {"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            for n, t in tensors
        ],
        "buckets": plan_buckets(tensors, bucket_bytes),
    }


def write_manifest(directory: Path, manifest: dict) -> None:
    (Path(directory) / MANIFEST_FILE).write_text(json.dumps(manifest) + "\n")


def read_manifest(directory: str | Path) -> dict | None:
    """The broadcast manifest published in `directory`, or None (a filesystem-only version)."""
    path = Path(directory) / MANIFEST_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _entry_bytes(entry: dict) -> int:
    numel = 1
    for d in entry["shape"]:
        numel *= d
    return numel * _dtype(entry["dtype"]).itemsize


def bucket_size(manifest: dict, bucket: list[int]) -> int:
    return sum(_aligned(_entry_bytes(e)) for e in manifest["tensors"][bucket[0] : bucket[1]])


def total_bytes(manifest: dict) -> int:
    """Tensor bytes one update moves to every worker (without the alignment padding)."""
    return sum(_entry_bytes(e) for e in manifest["tensors"])


def _connect(manifest: dict, timeout: timedelta) -> dist.TCPStore:
    host, port = manifest["address"]
    return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)


def backend_of(device: str) -> str:
    """NCCL when the buckets live on CUDA, else gloo."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def new_group(
    store: dist.Store, version: int, rank: int, world_size: int, timeout: timedelta, backend: str
) -> dist.ProcessGroup:
    """The standalone group of update `version` on `backend` (see `backend_of`)."""
    prefixed = dist.PrefixStore(f"update-{version}", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def _broadcast(group: dist.ProcessGroup, buffer: torch.Tensor, timeout: timedelta) -> None:
    group.broadcast(buffer, 0, timeout).wait(timeout)


def announce_peers(manifest: dict, labels: list[str]) -> None:
    """Tell the sender of `manifest` who joins: rank i + 1 is `labels[i]` (e.g. a server URL
    and worker index). Called once per update by whoever picks the participants."""
    try:
        store = _connect(manifest, timedelta(seconds=manifest["timeout_s"]))
        store.set(f"peers-{manifest['version']}", json.dumps(labels))
    except RuntimeError as exc:
        raise BroadcastError(
            f"update {manifest['version']}: cannot reach the trainer (store "
            f"{manifest['address'][0]}:{manifest['address'][1]}): {exc}"
        ) from exc


def finish_update(manifest: dict, files_needed: bool) -> str | None:
    """The orchestrator's verdict once every server answered: None when all got the update,
    else ask the trainer for the filesystem copy of this version and wait for its path
    (`Sender.serve_files`). BroadcastError when the trainer cannot be reached."""
    version = manifest["version"]
    timeout = timedelta(seconds=manifest["timeout_s"])
    try:
        store = _connect(manifest, timeout)
        store.set(f"verdict-{version}", "files" if files_needed else "ok")
        if not files_needed:
            return None
        return store.get(f"files-{version}").decode()
    except RuntimeError as exc:
        raise BroadcastError(
            f"update {version}: the trainer (store {manifest['address'][0]}:"
            f"{manifest['address'][1]}) did not provide the filesystem copy within "
            f"{timeout.total_seconds():.0f}s: {exc}"
        ) from exc


def request_files(manifest: dict) -> str | None:
    """A server rejoins between updates: ask the trainer for the filesystem copy of the version
    of `manifest` (`Sender.files_requested`). Its path, or None when the trainer has closed that
    version (its next update is under way: the server joins that one). BroadcastError when the
    trainer cannot be reached or does not answer within the manifest's timeout."""
    version, timeout = manifest["version"], manifest["timeout_s"]
    trainer = f"the trainer (store {manifest['address'][0]}:{manifest['address'][1]})"
    files, closed = f"files-{version}", f"closed-{version}"
    try:
        store = _connect(manifest, timedelta(seconds=timeout))
        store.set(f"rejoin-{version}", "1")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if store.check([files]):
                return store.get(files).decode()
            if store.check([closed]):
                return None
            time.sleep(0.05)
    except RuntimeError as exc:
        raise BroadcastError(f"update {version}: cannot reach {trainer}: {exc}") from exc
    raise BroadcastError(
        f"update {version}: {trainer} did not write the filesystem copy within {timeout:.0f}s"
    )


class Sender:
    """The trainer's side: hosts the store (for the life of the trainer) and sends updates."""

    def __init__(self, host: str, timeout_s: float, device: str = "cpu") -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=self.timeout
        )
        self.address = (host, self.store.port)
        self.device = device

    def manifest(self, version: int, tensors: list[Named], bucket_bytes: int) -> dict:
        return make_manifest(
            version,
            tensors,
            bucket_bytes,
            self.address,
            self.timeout.total_seconds(),
            backend_of(self.device),
        )

    def send(self, manifest: dict, tensors: list[Named]) -> list[str]:
        """Wait for the peers of `manifest`'s update, send every bucket; returns their labels.
        BroadcastError naming the peers that died, stalled or never joined."""
        version = manifest["version"]
        try:
            peers = json.loads(self.store.get(f"peers-{version}"))
        except RuntimeError as exc:
            raise BroadcastError(
                f"update {version}: nobody announced the peers within "
                f"{self.timeout.total_seconds():.0f}s: {exc}"
            ) from exc
        if not peers:
            return []
        prefix = f"update-{version}/"
        try:
            group = new_group(
                self.store, version, 0, 1 + len(peers), self.timeout, backend_of(self.device)
            )
        except RuntimeError as exc:
            missing = [
                f"rank {r} ({peers[r - 1]})"
                for r in range(1, len(peers) + 1)
                if not self.store.check([f"{prefix}joined/{r}"])
            ]
            raise BroadcastError(
                f"update {version}: peers never joined within "
                f"{self.timeout.total_seconds():.0f}s: {', '.join(missing) or 'unknown'}: {exc}"
            ) from exc
        try:
            for b, bucket in enumerate(manifest["buckets"]):
                try:
                    _broadcast(group, self._pack(manifest, tensors, bucket), self.timeout)
                except RuntimeError as exc:
                    dead = self._silent_peers(prefix, peers)
                    raise BroadcastError(
                        f"update {version}: bucket {b + 1} of {len(manifest['buckets'])} failed; "
                        f"peer(s) not responding: {', '.join(dead) or 'none found'}: {exc}"
                    ) from exc
            self._confirm(prefix, peers, version)
        finally:
            del group  # closes its connections now, not at the next collection
        return peers

    def _confirm(self, prefix: str, peers: list[str], version: int) -> None:
        """Wait for every peer to confirm the last bucket (a send can complete into a dead
        peer's socket buffer); BroadcastError naming those that did not."""
        keys = [f"{prefix}done/{r}" for r in range(1, len(peers) + 1)]
        try:
            self.store.wait(keys, self.timeout)
        except RuntimeError as exc:
            missing = [
                f"rank {r} ({peers[r - 1]})"
                for r, key in enumerate(keys, start=1)
                if not self.store.check([key])
            ]
            raise BroadcastError(
                f"update {version}: peer(s) did not confirm the last bucket within "
                f"{self.timeout.total_seconds():.0f}s: {', '.join(missing)}: {exc}"
            ) from exc

    def _poll(self, key: str, stop: threading.Event) -> bytes | None:
        """The store's value of `key` once it is set; None when `stop` is set first."""
        while not stop.is_set():
            if self.store.check([key]):
                return self.store.get(key)
            stop.wait(0.05)
        return None

    def files_wanted(self, version: int, stop: threading.Event) -> bool:
        """Wait for the orchestrator's verdict on update `version` (`finish_update`): True when
        some server needs the filesystem copy. False also when `stop` is set first."""
        return self._poll(f"verdict-{version}", stop) == b"files"

    def files_requested(self, version: int, stop: threading.Event) -> bool:
        """After an update every server got: wait until `stop` (the next update) for a server
        that rejoins and asks for `version`'s filesystem copy (`request_files`)."""
        return self._poll(f"rejoin-{version}", stop) is not None

    def serve_files(self, version: int, path: str) -> None:
        """Tell the orchestrator where the filesystem copy of `version` is."""
        self.store.set(f"files-{version}", path)

    def close_version(self, version: int) -> None:
        """No filesystem copy of `version` will be written from now on (unless it exists)."""
        self.store.set(f"closed-{version}", "1")

    def _pack(self, manifest: dict, tensors: list[Named], bucket: list[int]) -> torch.Tensor:
        buffer = torch.empty(bucket_size(manifest, bucket), dtype=torch.uint8, device=self.device)
        offset = 0
        for _, tensor in tensors[bucket[0] : bucket[1]]:
            raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[offset : offset + raw.numel()].copy_(raw)
            offset += _aligned(raw.numel())
        return buffer

    def _silent_peers(self, prefix: str, peers: list[str]) -> list[str]:
        """Peers that are not done and whose heartbeat did not move for 5 periods."""
        keys = [f"{prefix}beat/{r}" for r in range(1, len(peers) + 1)]
        before = [self.store.add(k, 0) for k in keys]
        time.sleep(5 * HEARTBEAT_S)
        return [
            f"rank {r} ({peers[r - 1]})"
            for r, key, old in zip(range(1, len(peers) + 1), keys, before, strict=True)
            if self.store.add(key, 0) == old and not self.store.check([f"{prefix}done/{r}"])
        ]


class _Heartbeat:
    """A receiver's heartbeat: a counter in the store bumped every HEARTBEAT_S (own client)."""

    def __init__(self, manifest: dict, key: str, timeout: timedelta) -> None:
        self.store = _connect(manifest, timeout)
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


def receive(manifest: dict, rank: int) -> Iterator[list[Named]]:
    """A worker's side: join update `manifest["version"]` as `rank` and yield each bucket's
    (name, tensor) pairs as it arrives (views into the bucket's buffer: on this process's
    current CUDA device with NCCL, else on CPU). BroadcastError naming the trainer when it
    dies or stalls past the manifest's timeout."""
    version = manifest["version"]
    backend = manifest.get("backend", "gloo")
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    timeout = timedelta(seconds=manifest["timeout_s"])
    trainer = f"the trainer (rank 0, store {manifest['address'][0]}:{manifest['address'][1]})"
    prefix = f"update-{version}/"
    try:
        store = _connect(manifest, timeout)
        peers = json.loads(store.get(f"peers-{version}"))
        store.set(f"{prefix}joined/{rank}", "1")
        heartbeat = _Heartbeat(manifest, f"{prefix}beat/{rank}", timeout)
    except RuntimeError as exc:
        raise BroadcastError(f"update {version}: cannot reach {trainer}: {exc}") from exc
    try:
        group = new_group(store, version, rank, 1 + len(peers), timeout, backend)
        tensors = manifest["tensors"]
        for b, bucket in enumerate(manifest["buckets"]):
            buffer = torch.empty(bucket_size(manifest, bucket), dtype=torch.uint8, device=device)
            try:
                _broadcast(group, buffer, timeout)
            except RuntimeError as exc:
                raise BroadcastError(
                    f"update {version}: bucket {b + 1} of {len(manifest['buckets'])} never "
                    f"arrived from {trainer} within {timeout.total_seconds():.0f}s: {exc}"
                ) from exc
            out, offset = [], 0
            for entry in tensors[bucket[0] : bucket[1]]:
                n = _entry_bytes(entry)
                view = buffer[offset : offset + n].view(_dtype(entry["dtype"]))
                out.append((entry["name"], view.view(entry["shape"])))
                offset += _aligned(n)
            if b == len(manifest["buckets"]) - 1:
                store.set(f"{prefix}done/{rank}", "1")
            yield out
    except RuntimeError as exc:
        if isinstance(exc, BroadcastError):
            raise
        raise BroadcastError(f"update {version}: joining the group with {trainer}: {exc}") from exc
    finally:
        heartbeat.close()
