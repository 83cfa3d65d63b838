"""What a published policy version is: one typed record, written beside (or instead of) the
tensors, that the trainer publishes, the orchestrator delivers and every engine worker checks.

`PublishedVersion` (``rlkit_version.json`` in ``weights/step_N``) holds the version, the
transport that moves its tensors (`rlkit.weights`), the tensor table in send order (name,
dtype, shape and an exact checksum: the fingerprint), the trainer's logprobs of the canary
sequence (`rlkit.inference.canary`), the transport's own delivery fields (a broadcast's store
address and buckets, an ipc buffer's handle) and an HMAC signature over all of it with the run's
key (`rlkit.protocol.credentials`). The orchestrator learns everything about a version from it;
a server verifies the signature before it acts on any field, and each worker checks what it
received against the tensor table before any tensor reaches the model.

Checksums: two integer sums over a tensor's bytes read as int16 (uint8 for an odd byte count),
the plain sum and a position-weighted one (`tensor_checksum`). Integer sums do not depend on the
order of addition (thread count, device), so trainer and worker agree exactly; the weighted sum
also tells apart tensors whose elements moved (a swapped block, a transposed copy). Stale
weights, a partial file, a tensor corrupted in flight or sent under the wrong name all fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rlkit.protocol.credentials import sign, verify

if TYPE_CHECKING:  # torch is imported where tensors are handled: the record side needs none
    import torch

VERSION_FILE = "rlkit_version.json"
WEIGHT_MOD = 65521  # positions are weighted 1..65521, repeating
CHUNK = WEIGHT_MOD * 64  # elements per step (~4 M): bounds temporary memory, keeps sums exact
ALIGN = 64  # byte offset of every tensor packed in a buffer: any dtype may view it in place
Named = tuple[str, "torch.Tensor"]


class TensorEntry(BaseModel):
    """One tensor of a version: what a worker must receive under `name`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dtype: str
    shape: tuple[int, ...]
    checksum: tuple[int, int]

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


def _weights(device: torch.device) -> torch.Tensor:
    """Position weights of one chunk (every chunk starts at a multiple of WEIGHT_MOD)."""
    import torch

    key = str(device)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = (torch.arange(CHUNK, device=device) % WEIGHT_MOD + 1).double()
    return _WEIGHTS[key]


_WEIGHTS: dict[str, torch.Tensor] = {}


def tensor_checksum(tensor: torch.Tensor) -> tuple[int, int]:
    """(sum, position-weighted sum) of the tensor's bytes as int16 (or uint8), exact.

    Computed in float64, where every partial sum is an integer below 2**53 (int16 values times
    weights <= 65521, at most CHUNK of them) and therefore exact in any order; BLAS's dot
    product makes it one fast pass.
    """
    import torch

    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.numel() % 2 == 0:
        flat = flat.view(torch.int16)
    weights = _weights(flat.device)
    total = weighted = 0
    for start in range(0, flat.numel(), CHUNK):
        values = flat[start : start + CHUNK].double()
        total += int(values.sum())
        weighted += int(torch.dot(values, weights[: values.numel()]))
    return total, weighted


def tensor_entry(name: str, tensor: torch.Tensor) -> TensorEntry:
    return TensorEntry(
        name=name,
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        checksum=tensor_checksum(tensor),
    )


def tensor_table(tensors: Iterable[Named]) -> list[TensorEntry]:
    """The fingerprint of (name, tensor) pairs, in their order."""
    return [tensor_entry(name, tensor) for name, tensor in tensors]


def mismatches(received: Iterable[Named], expected: list[TensorEntry], limit: int = 5) -> list[str]:
    """What differs between the tensors a worker received and the published table (at most
    `limit` lines; empty when they match)."""
    want = {e.name: e for e in expected}
    problems: list[str] = []
    seen: set[str] = set()
    for name, tensor in received:
        seen.add(name)
        entry = want.get(name)
        if entry is None:
            problems.append(f"tensor {name!r} was not published")
        elif (got := tensor_entry(name, tensor)) != entry:
            what = [
                k for k in ("dtype", "shape", "checksum") if getattr(got, k) != getattr(entry, k)
            ]
            problems.append(f"tensor {name!r}: {'/'.join(what)} differs from the published one")
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
