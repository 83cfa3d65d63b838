"""What a published policy version is: one typed record, written beside (or instead of) the
tensors, that the trainer publishes, the orchestrator delivers and every engine worker checks.

`PublishedVersion` (``rlkit_version.json`` in ``weights/step_N``) holds the version, the
transport that moves its tensors (`rlkit.weights`), the tensor table in send order (name,
dtype, shape and a keyed digest of the bytes: the fingerprint), the trainer's logprobs of the
canary sequence (`rlkit.inference.canary`), the transport's own delivery fields (a broadcast's
store address and buckets, an ipc buffer's handle) and an HMAC signature over all of it with the
run's key (`rlkit.protocol.credentials`). The orchestrator learns everything about a version from
it; a server verifies the signature before it acts on any field, and each worker checks what it
received against the tensor table before any tensor reaches the model.

Digests: BLAKE3 in keyed mode over a tensor's raw bytes (its contiguous CPU view as uint8, so
any dtype and device; `tensor_digest`) under a 32-byte key derived from the run's token
(`credentials.digest_key`), hex in the table. A cryptographic hash has no order of addition to
disagree on, so trainer and worker agree exactly on every device and thread count; and unlike a
sum it cannot be satisfied by adjusting other bytes: whoever alters a tensor on its way (a
process in a broadcast's path, anything that can write the shared buffer or the files) would
have to find a BLAKE3 collision, under a key they do not hold, to keep its entry. The signature
stops them from rewriting the table instead. Stale weights, a partial file, a tensor changed in
flight, by accident or on purpose, or sent under the wrong name all fail. Tensors are digested
in parallel (`Digester`: a thread per core over tensors, and BLAKE3's own threads inside a big
one); the trainer hands each tensor over as it is gathered, so its digest runs while the next
one is gathered (`rlkit.trainer.export`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rlkit.protocol.credentials import sign, verify

if TYPE_CHECKING:  # torch is imported where tensors are handled: the record side needs none
    import torch

VERSION_FILE = "rlkit_version.json"
THREADED_BYTES = 4 << 20  # a tensor at least this big is hashed on BLAKE3's own threads too
ALIGN = 64  # byte offset of every tensor packed in a buffer: any dtype may view it in place
Named = tuple[str, "torch.Tensor"]


class TensorEntry(BaseModel):
    """One tensor of a version: what a worker must receive under `name`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dtype: str
    shape: tuple[int, ...]
    digest: str  # hex keyed BLAKE3 of the tensor's bytes (module doc)

    @property
    def nbytes(self) -> int:
        import torch

        numel = 1
        for d in self.shape:
            numel *= d
        return numel * getattr(torch, self.dtype).itemsize


class Canary(BaseModel):
    """The trainer's logprobs of a fixed token sequence under this version's weights:
    logprobs[i] is its logprob of token_ids[i + 1]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_ids: list[int]
    logprobs: list[float]


class PublishedVersion(BaseModel):
    """A policy version as the trainer published it (module doc)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0)
    transport: str
    tensors: list[TensorEntry]
    canary: Canary | None = None
    delivery: dict[str, Any] = Field(default_factory=dict)  # the transport's own (typed there)
    signature: str | None = None

    @property
    def nbytes(self) -> int:
        """Tensor bytes one update moves to every worker."""
        return sum(t.nbytes for t in self.tensors)

    def shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """{name: (dtype, shape)}: what a server compares with the checkpoint it serves."""
        return {t.name: (t.dtype, t.shape) for t in self.tensors}

    def payload(self) -> bytes:
        """The canonical bytes the signature covers (everything but the signature)."""
        return self.model_dump_json(exclude={"signature"}).encode()

    def signed(self, token: str | None) -> PublishedVersion:
        """This record signed with the run's token (`rlkit.protocol.credentials`); unsigned
        when there is none (a server then refuses it)."""
        if token is None:
            return self.model_copy(update={"signature": None})
        return self.model_copy(update={"signature": sign(self.payload(), token)})

    def signed_by(self, token: str) -> bool:
        """Whether the holder of `token` signed exactly this record."""
        return verify(self.payload(), self.signature, token)

    def write(self, directory: Path) -> None:
        (Path(directory) / VERSION_FILE).write_text(self.model_dump_json() + "\n")

    @classmethod
    def read(cls, directory: str | Path) -> PublishedVersion | None:
        """The record published in `directory`, or None when it has none (e.g. an adapter)."""
        path = Path(directory) / VERSION_FILE
        return cls.model_validate_json(path.read_text()) if path.is_file() else None


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def packed_offsets(entries: Iterable[TensorEntry]) -> tuple[list[int], int]:
    """Byte offset of each tensor packed back to back at ALIGN, and the total size."""
    offsets, size = [], 0
    for entry in entries:
        offsets.append(size)
        size += aligned(entry.nbytes)
    return offsets, size


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in memory order: a view of a contiguous CPU tensor (no copy); one on
    another device is copied to the CPU first, a strided one made contiguous."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def tensor_digest(tensor: torch.Tensor, key: bytes) -> str:
    """Hex keyed BLAKE3 of the tensor's bytes under `key` (32 bytes: `credentials.digest_key`).
    BLAKE3 releases the GIL, so `digests` runs these on several threads."""
    from blake3 import blake3

    raw = tensor_bytes(tensor)
    threads = blake3.AUTO if raw.nbytes >= THREADED_BYTES else 1
    return blake3(raw, key=key, max_threads=threads).hexdigest()


def tensor_entry(name: str, tensor: torch.Tensor, digest: str) -> TensorEntry:
    return TensorEntry(
        name=name,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        digest=digest,
    )


class Digester:
    """Digests tensors on a thread per core as they are handed over (`add`), so where tensors
    are produced one at a time (the trainer's gather) their digests run while the next one is
    made, and the table costs no pass of its own; `table` takes the digest of each tensor
    object already added and makes the others'. A tensor must not change once added."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.pool = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="rlkit-digest")
        self.pending: dict[int, tuple[torch.Tensor, Future[str]]] = {}  # id -> (tensor, digest)

    def add(self, tensor: torch.Tensor) -> None:
        if id(tensor) not in self.pending:  # held here: its id is not reused meanwhile
            self.pending[id(tensor)] = (tensor, self.pool.submit(tensor_digest, tensor, self.key))

    def table(self, tensors: Iterable[Named]) -> list[TensorEntry]:
        """The fingerprint of (name, tensor) pairs, in their order."""
        pairs = list(tensors)
        for _, tensor in pairs:
            self.add(tensor)
        return [tensor_entry(n, t, self.pending[id(t)][1].result()) for n, t in pairs]

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.pending.clear()

    def __enter__(self) -> Digester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tensor_table(tensors: Iterable[Named], key: bytes) -> list[TensorEntry]:
    """The fingerprint of (name, tensor) pairs, in their order, digested under `key`."""
    with Digester(key) as digester:
        return digester.table(tensors)


def mismatches(
    received: Iterable[Named],
    expected: list[TensorEntry],
    key: bytes | Digester,
    limit: int = 5,
) -> list[str]:
    """What differs between the tensors a worker received and the published table, whose
    digests were made under `key` (or a `Digester` under it, holding some of the received
    tensors' digests already); at most `limit` lines, empty when they match."""
    want = {e.name: e for e in expected}
    problems: list[str] = []
    pairs = list(received)
    seen = {name for name, _ in pairs}
    if isinstance(key, Digester):
        got_table = key.table(pairs)
    else:
        got_table = tensor_table(pairs, key)
    for got in got_table:
        entry = want.get(got.name)
        if entry is None:
            problems.append(f"tensor {got.name!r} was not published")
        elif got != entry:
            what = [k for k in ("dtype", "shape", "digest") if getattr(got, k) != getattr(entry, k)]
            problems.append(f"tensor {got.name!r}: {'/'.join(what)} differs from the published one")
    problems += [f"tensor {name!r} published but not received" for name in want.keys() - seen]
    return problems[:limit]


def iter_safetensors(path: str | Path) -> Iterator[Named]:
    """Yield (name, tensor) from every ``*.safetensors`` file in a directory, in name order."""
    from safetensors import safe_open

    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def published_bytes(directory: str | Path) -> int:
    """Bytes of tensors a published version moves to every server: its record's, or for a
    directory without one (a LoRA adapter, a base model) its safetensors files'."""
    record = PublishedVersion.read(directory)
    if record is not None:
        return record.nbytes
    return sum(f.stat().st_size for f in Path(directory).glob("*.safetensors"))
