"""What a published policy version is: one typed record, written beside (or instead of) the
tensors, that the trainer publishes, the orchestrator delivers and every engine worker checks.

`PublishedVersion` (``rlkit_version.json`` in ``weights/step_N``) holds the version, the
transport that moves its tensors (`rlkit.weights`), a random nonce of this publication, the
tensor table in send order (name, dtype, shape and an authentication tag of the bytes), the
transport's own delivery fields (a broadcast's store address and buckets, an ipc buffer's
handle) and an HMAC signature over all of it with the run's key (`rlkit.protocol.credentials`).
The orchestrator learns everything about a version from it; a server verifies the signature
before it acts on any field, and each worker checks what it received against the tensor table
before any tensor reaches the model. The trainer's logprobs of the canary sequence
(`rlkit.inference.canary`) follow in a signed file of their own (`Canary`, ``rlkit_canary.json``,
bound to the record by version and nonce), written once the tensors are on their way: the
servers load the version while the trainer scores the canary.

Tags: Poly1305 over a tensor's raw bytes (its contiguous CPU view as uint8, so any dtype and
device), used as a one-time authenticator. Each publication draws a fresh 16-byte nonce
(`PublishedVersion.nonce`, under the signature); a tensor's Poly1305 key is keyed BLAKE2b of
(nonce, tensor name) under the run's secret 32-byte digest key (`credentials.digest_key`;
`Digester.tensor_key`), and names are unique within a table, so no key ever authenticates two
different byte strings, even when a version number is published again after a resume. Under a
secret key used once, whoever alters a tensor of L bytes on its way (a process in a broadcast's
path, anything that can write the shared buffer or the files), having seen its tag, keeps the
tag with probability at most 8*ceil(L/16)/2**106 per try (Poly1305's bound: below 2**-76 for a
1 GiB tensor); the signature stops them from rewriting the table or the nonce instead. Why
Poly1305 rather than a keyed hash: it runs at memory speed (12.6 GB/s on one core of the 2-core
AMD EPYC that runs the benchmarks, about a plain copy of the bytes, where keyed BLAKE3 took
2-2.7x the copy), and trainer and worker agree exactly on every device. Stale weights, a
partial file, a tensor changed in flight, by accident or on purpose, or sent under the wrong
name all fail.

The tags are OpenSSL's Poly1305, called through its EVP_MAC API (OpenSSL >= 3, the libcrypto
Python itself links) with ctypes, which lets go of the GIL during the call: a `Digester` tags
tensors on a thread per core (up to `MAX_THREADS`). Where that library is missing, the
`cryptography` package's Poly1305 (the same OpenSSL code, bundled) is used on one thread, a few
MiB per call: it holds the GIL, so two threads tag no faster than one. Either way the trainer
hands each tensor over as it is gathered (`rlkit.trainer.export`), and a worker's transport
what arrived, and with a core to spare (`Digester.beside`) its tag runs while the next one is
made.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlkit.protocol.credentials import sign, verify

if TYPE_CHECKING:  # torch is imported where tensors are handled: the record side needs none
    import torch

VERSION_FILE = "rlkit_version.json"
CANARY_FILE = "rlkit_canary.json"
NONCE_BYTES = 16  # a publication's random nonce: two of them collide with probability 2**-128
TAG_BYTES = 16  # a Poly1305 tag
CHUNK_BYTES = 8 << 20  # bytes per `cryptography` Poly1305 call: other threads run between them
MAX_THREADS = 8  # a Digester's threads at most (one per core): the tags are memory-bound
BESIDE_CORES = 4  # with fewer cores, tensors handed over are tagged at `table`, not meanwhile
_NONCE = re.compile(rf"^(?:[0-9a-f]{{2}}){{{NONCE_BYTES},64}}$")
_PUBLICATION = b"rlkit-pub-v1"  # BLAKE2b personalisations (<= 16 bytes): one per derivation
_TENSOR = b"rlkit-tensor-v1"
ALIGN = 64  # byte offset of every tensor packed in a buffer: any dtype may view it in place
Named = tuple[str, "torch.Tensor"]


class TensorEntry(BaseModel):
    """One tensor of a version: what a worker must receive under `name`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dtype: str
    shape: tuple[int, ...]
    # hex Poly1305 tag of the tensor's bytes under its one-time key (module doc)
    digest: str = Field(pattern=rf"^[0-9a-f]{{{2 * TAG_BYTES}}}$")

    @property
    def nbytes(self) -> int:
        import torch

        numel = 1
        for d in self.shape:
            numel *= d
        return numel * getattr(torch, self.dtype).itemsize


class SignedRecord(BaseModel):
    """A record kept in one file (`FILE`) of a version's directory, signed with the run's key
    (`rlkit.protocol.credentials`): the signature covers every other field."""

    FILE: ClassVar[str]
    signature: str | None = None

    def payload(self) -> bytes:
        """The canonical bytes the signature covers (everything but the signature)."""
        return self.model_dump_json(exclude={"signature"}).encode()

    def signed(self, token: str | None) -> Self:
        """This record signed with the run's token; unsigned when there is none (a server, and
        the orchestrator's canary, then refuse it)."""
        if token is None:
            return self.model_copy(update={"signature": None})
        return self.model_copy(update={"signature": sign(self.payload(), token)})

    def signed_by(self, token: str) -> bool:
        """Whether the holder of `token` signed exactly this record."""
        return verify(self.payload(), self.signature, token)

    def write(self, directory: Path) -> None:
        """Into `directory`, whole or not at all: readers may be looking for it already."""
        path = Path(directory) / self.FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.model_dump_json() + "\n")
        os.replace(tmp, path)

    @classmethod
    def read(cls, directory: str | Path) -> Self | None:
        """The record in `directory`, or None when it has none."""
        path = Path(directory) / cls.FILE
        return cls.model_validate_json(path.read_text()) if path.is_file() else None


class Canary(SignedRecord):
    """The trainer's logprobs of a fixed token sequence under a published version's weights
    (logprobs[i]: its logprob of token_ids[i + 1]; `rlkit.inference.canary`). A file of its own,
    written after the version's tensors are on their way, so the servers load while the trainer
    scores it; `version` and `nonce` name the publication it belongs to."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    FILE: ClassVar[str] = CANARY_FILE

    version: int = Field(ge=0)
    nonce: str = Field(pattern=_NONCE.pattern)
    token_ids: list[int]
    logprobs: list[float]

    def belongs_to(self, record: PublishedVersion) -> bool:
        """Whether this canary scores the publication `record` describes."""
        return (self.version, self.nonce) == (record.version, record.nonce)


class PublishedVersion(SignedRecord):
    """A policy version as the trainer published it (module doc)."""

    model_config = ConfigDict(extra="forbid")
    FILE: ClassVar[str] = VERSION_FILE

    version: int = Field(ge=0)
    transport: str
    # this publication's random nonce (hex, >= NONCE_BYTES): with each tensor's name, it picks
    # the tensor's one-time Poly1305 key (module doc); drawn anew whenever a version is published
    nonce: str = Field(pattern=_NONCE.pattern)
    tensors: list[TensorEntry]
    delivery: dict[str, Any] = Field(default_factory=dict)  # the transport's own (typed there)

    @model_validator(mode="after")
    def _names_unique(self) -> PublishedVersion:
        """One entry per name: a name picks a tensor's key, which must authenticate one tensor."""
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"tensor names published twice: {', '.join(twice[:5])}")
        return self

    @classmethod
    def build(
        cls,
        version: int,
        transport: str,
        tensors: Iterable[Named],
        key: bytes | Digester,
        **fields: Any,
    ) -> PublishedVersion:
        """The record of (name, tensor) pairs published as `version` through `transport`: their
        table under a fresh nonce and the run's digest `key`, or under a `Digester`'s nonce with
        the tags it holds already; `fields`: the record's others (delivery)."""
        if isinstance(key, Digester):
            return cls(
                version=version,
                transport=transport,
                nonce=key.nonce,
                tensors=key.table(tensors),
                **fields,
            )
        nonce = new_nonce()
        table = tensor_table(tensors, key, nonce)
        return cls(version=version, transport=transport, nonce=nonce, tensors=table, **fields)

    @property
    def nbytes(self) -> int:
        """Tensor bytes one update moves to every worker."""
        return sum(t.nbytes for t in self.tensors)

    def shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """{name: (dtype, shape)}: what a server compares with the checkpoint it serves."""
        return {t.name: (t.dtype, t.shape) for t in self.tensors}


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def packed_offsets(entries: Iterable[TensorEntry]) -> tuple[list[int], int]:
    """Byte offset of each tensor packed back to back at ALIGN, and the total size."""
    offsets, size = [], 0
    for entry in entries:
        offsets.append(size)
        size += aligned(entry.nbytes)
    return offsets, size


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in memory order, as uint8: a view of a contiguous CPU tensor (no
    copy); one on another device is copied to the CPU first, a strided one made contiguous."""
    import torch

    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """`raw_bytes` as a memoryview."""
    return memoryview(raw_bytes(tensor).numpy())


def new_nonce() -> str:
    """A fresh publication nonce (NONCE_BYTES random bytes, hex)."""
    return secrets.token_hex(NONCE_BYTES)


class OpenSSLPoly1305:
    """OpenSSL's Poly1305 through its EVP_MAC API (OpenSSL >= 3), called with ctypes: the GIL
    is let go during each call, so tensors are tagged on several threads at once."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, size = ctypes.c_void_p, ctypes.c_size_t
        for name, restype, argtypes in (
            ("EVP_MAC_fetch", p, [p, ctypes.c_char_p, ctypes.c_char_p]),
            ("EVP_MAC_CTX_new", p, [p]),
            ("EVP_MAC_CTX_free", None, [p]),
            ("EVP_MAC_init", ctypes.c_int, [p, ctypes.c_char_p, size, p]),
            ("EVP_MAC_update", ctypes.c_int, [p, p, size]),
            ("EVP_MAC_final", ctypes.c_int, [p, ctypes.c_char_p, ctypes.POINTER(size), size]),
        ):
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        self.lib = lib
        self.mac = lib.EVP_MAC_fetch(None, b"POLY1305", None)
        if not self.mac:
            raise OSError("this OpenSSL has no POLY1305 MAC")

    def tag(self, key: bytes, address: int, nbytes: int) -> bytes:
        """The tag of the `nbytes` at `address` (alive for the call) under the 32-byte `key`."""
        lib, ctx = self.lib, self.lib.EVP_MAC_CTX_new(self.mac)
        if not ctx:
            raise MemoryError("EVP_MAC_CTX_new")
        try:
            out, written = ctypes.create_string_buffer(TAG_BYTES), ctypes.c_size_t()
            ok = lib.EVP_MAC_init(ctx, key, len(key), None) == 1
            ok = ok and (nbytes == 0 or lib.EVP_MAC_update(ctx, address, nbytes) == 1)
            ok = ok and lib.EVP_MAC_final(ctx, out, ctypes.byref(written), TAG_BYTES) == 1
            if not ok or written.value != TAG_BYTES:
                raise RuntimeError("OpenSSL's Poly1305 failed")
            return out.raw
        finally:
            lib.EVP_MAC_CTX_free(ctx)


@functools.cache
def openssl_poly1305() -> OpenSSLPoly1305 | None:
    """OpenSSL's Poly1305 without the GIL, or None where no OpenSSL >= 3 libcrypto is found
    (`RLKIT_POLY1305=cryptography` asks for the `cryptography` package's instead)."""
    if os.environ.get("RLKIT_POLY1305") == "cryptography":
        return None
    for name in (ctypes.util.find_library("crypto"), "libcrypto.so.3"):
        if not name:
            continue
        try:
            return OpenSSLPoly1305(ctypes.CDLL(name))
        except (OSError, AttributeError):
            continue
    return None


def tag_threads() -> int:
    """How many threads tag at once: one per core without the GIL, else one (module doc)."""
    return min(os.cpu_count() or 1, MAX_THREADS) if openssl_poly1305() is not None else 1


def tensor_tag(tensor: torch.Tensor, one_time_key: bytes) -> str:
    """Hex Poly1305 tag of the tensor's bytes under `one_time_key` (32 bytes), which must
    authenticate nothing else (`Digester.tensor_key`): by OpenSSL without the GIL where it can
    (`openssl_poly1305`), else by the `cryptography` package CHUNK_BYTES at a time, so other
    threads run between the calls."""
    flat = raw_bytes(tensor)
    openssl = openssl_poly1305()
    if openssl is not None:
        return openssl.tag(one_time_key, flat.data_ptr(), flat.numel()).hex()
    from cryptography.hazmat.primitives.poly1305 import Poly1305

    raw = memoryview(flat.numpy())
    mac = Poly1305(one_time_key)
    for start in range(0, raw.nbytes, CHUNK_BYTES):
        mac.update(raw[start : start + CHUNK_BYTES])
    return mac.finalize().hex()


def tensor_entry(name: str, tensor: torch.Tensor, digest: str) -> TensorEntry:
    return TensorEntry(
        name=name,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        digest=digest,
    )


class Digester:
    """Tags the tensors of one publication (`nonce`: the record's, or a fresh one) under the
    run's digest `key`. Where tensors are produced one at a time (the trainer's gather, a
    transport's arrivals) and the machine has a core to spare (`beside`: BESIDE_CORES or more),
    each is tagged as it is handed over (`add`), while the next one is made, so the table costs
    no pass of its own; with fewer cores the producer keeps them (on 2 cores a broadcast's
    receive took 1.2-1.5x longer with the tags beside it, as long as receiving then tagging).
    `table` takes the tag of each (name, tensor) already added and makes the others'. A tensor
    must not change once added. Threads: `tag_threads` (module doc)."""

    def __init__(self, key: bytes, nonce: str | None = None, beside: bool | None = None) -> None:
        if len(key) != 32:
            raise ValueError(f"the tensor table's key is 32 bytes, not {len(key)}")
        self.nonce = new_nonce() if nonce is None else nonce
        if not _NONCE.fullmatch(self.nonce):
            raise ValueError(f"a publication nonce is >= {NONCE_BYTES} bytes of lowercase hex")
        nonce_bytes = bytes.fromhex(self.nonce)
        self._key = hashlib.blake2b(
            nonce_bytes, key=key, digest_size=32, person=_PUBLICATION
        ).digest()  # this publication's: the run's key and the nonce
        self.threads = tag_threads()
        self.beside = (os.cpu_count() or 1) >= BESIDE_CORES if beside is None else beside
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rlkit-digest")
        # (id of a tensor, its name) -> (the tensor: held, so its id is not reused; its tag)
        self.pending: dict[tuple[int, str], tuple[torch.Tensor, Future[str]]] = {}

    def tensor_key(self, name: str) -> bytes:
        """The one-time Poly1305 key of the tensor published as `name` in this publication:
        keyed BLAKE2b of the name under the publication's key (that of the run's key and the
        nonce)."""
        mac = hashlib.blake2b(name.encode(), key=self._key, digest_size=32, person=_TENSOR)
        return mac.digest()

    def digest(self, name: str, tensor: torch.Tensor) -> str:
        """The tag of `tensor` published as `name`, now, on this thread."""
        return tensor_tag(tensor, self.tensor_key(name))

    def add(self, tensor: torch.Tensor, name: str) -> None:
        """Start tagging `tensor`, published as `name`, on the threads (when `beside`)."""
        if self.beside:
            self._submit(tensor, name)

    def _submit(self, tensor: torch.Tensor, name: str) -> Future[str]:
        if (id(tensor), name) not in self.pending:
            future = self.pool.submit(self.digest, name, tensor)
            self.pending[id(tensor), name] = (tensor, future)
        return self.pending[id(tensor), name][1]

    def table(self, tensors: Iterable[Named]) -> list[TensorEntry]:
        """The table of (name, tensor) pairs, in their order: those never handed over are
        tagged here, on the threads if there are several, else on this one (no hand-over)."""
        pairs = list(tensors)
        tags: list[str | Future[str]] = []
        for name, tensor in pairs:
            if (id(tensor), name) in self.pending:
                tags.append(self.pending[id(tensor), name][1])
            elif self.threads > 1:
                tags.append(self._submit(tensor, name))
            else:
                tags.append(self.digest(name, tensor))
        return [
            tensor_entry(name, tensor, tag if isinstance(tag, str) else tag.result())
            for (name, tensor), tag in zip(pairs, tags, strict=True)
        ]

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.pending.clear()

    def __enter__(self) -> Digester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tensor_table(tensors: Iterable[Named], key: bytes, nonce: str) -> list[TensorEntry]:
    """The table of (name, tensor) pairs, in their order, tagged for the publication `nonce`
    under the run's digest `key` (a record's table: `PublishedVersion.build`)."""
    with Digester(key, nonce) as digester:
        return digester.table(tensors)


def mismatches(
    received: Iterable[Named],
    record: PublishedVersion,
    key: bytes | Digester,
    limit: int = 5,
) -> list[str]:
    """What differs between the tensors a worker received and `record`'s table, whose tags were
    made under the run's digest `key` (or a `Digester` under it for the record's nonce, holding
    some of the received tensors' tags already); at most `limit` lines, empty when they match.
    Tags are compared in constant time, and no line shows one."""
    if isinstance(key, Digester) and key.nonce != record.nonce:
        raise ValueError("the Digester tags another publication than this record's (nonce)")
    want = {e.name: e for e in record.tensors}
    problems: list[str] = []
    pairs = list(received)
    seen = {name for name, _ in pairs}
    if isinstance(key, Digester):
        got_table = key.table(pairs)
    else:
        got_table = tensor_table(pairs, key, record.nonce)
    for got in got_table:
        entry = want.get(got.name)
        if entry is None:
            problems.append(f"tensor {got.name!r} was not published")
            continue
        what = [k for k in ("dtype", "shape") if getattr(got, k) != getattr(entry, k)]
        if not hmac.compare_digest(got.digest, entry.digest):
            what.append("digest")
        if what:
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
