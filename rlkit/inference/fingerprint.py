"""Fingerprints of published weights: what the trainer sent, checked by every engine worker.

A fingerprint maps each tensor name to its dtype, shape and an exact checksum of its bytes:
two integer sums over the bytes read as int16 (uint8 for an odd byte count), the plain sum and a
position-weighted one (see `tensor_checksum`). Integer sums do not depend on the order of
addition (thread count, device), so trainer and worker agree exactly; the weighted sum also
tells apart tensors whose elements moved (a swapped block, a transposed copy). One pass over the
data, on the device where the tensor is. Stale weights, a partial file, a tensor corrupted in
flight or sent under the wrong name all fail the check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

FINGERPRINT_FILE = "rlkit_fingerprint.json"
WEIGHT_MOD = 65521  # positions are weighted 1..65521, repeating
CHUNK = WEIGHT_MOD * 64  # elements per step (~4 M): bounds temporary memory, keeps sums exact

Fingerprint = dict[str, dict]


def _weights(device: torch.device) -> torch.Tensor:
    """Position weights of one chunk (every chunk starts at a multiple of WEIGHT_MOD)."""
    key = str(device)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = (torch.arange(CHUNK, device=device) % WEIGHT_MOD + 1).double()
    return _WEIGHTS[key]


_WEIGHTS: dict[str, torch.Tensor] = {}


def tensor_checksum(tensor: torch.Tensor) -> list[int]:
    """[sum, position-weighted sum] of the tensor's bytes as int16 (or uint8), exact.

    Computed in float64, where every partial sum is an integer below 2**53 (int16 values times
    weights <= 65521, at most CHUNK of them) and therefore exact in any order; BLAS's dot
    product makes it one fast pass.
    """
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.numel() % 2 == 0:
        flat = flat.view(torch.int16)
    weights = _weights(flat.device)
    total = weighted = 0
    for start in range(0, flat.numel(), CHUNK):
        values = flat[start : start + CHUNK].double()
        total += int(values.sum())
        weighted += int(torch.dot(values, weights[: values.numel()]))
    return [total, weighted]


def tensor_entry(tensor: torch.Tensor) -> dict:
    return {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "checksum": tensor_checksum(tensor),
    }


def fingerprint(tensors: Iterable[tuple[str, torch.Tensor]]) -> Fingerprint:
    """The fingerprint of (name, tensor) pairs."""
    return {name: tensor_entry(tensor) for name, tensor in tensors}


def write_fingerprint(directory: Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    (Path(directory) / FINGERPRINT_FILE).write_text(json.dumps(fingerprint(tensors)) + "\n")


def read_fingerprint(directory: str | Path) -> Fingerprint | None:
    """The fingerprint published with a weights directory, or None when it has none."""
    path = Path(directory) / FINGERPRINT_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def mismatches(
    received: Iterable[tuple[str, torch.Tensor]], expected: Fingerprint, limit: int = 5
) -> list[str]:
    """What differs between the tensors a worker received and the published fingerprint
    (at most `limit` lines; empty when they match)."""
    problems: list[str] = []
    seen: set[str] = set()
    for name, tensor in received:
        seen.add(name)
        want = expected.get(name)
        if want is None:
            problems.append(f"tensor {name!r} was not published")
        elif (got := tensor_entry(tensor)) != want:
            what = [k for k in ("dtype", "shape", "checksum") if got[k] != want[k]]
            problems.append(f"tensor {name!r}: {'/'.join(what)} differs from the published one")
    problems += [f"tensor {name!r} published but not received" for name in expected.keys() - seen]
    return problems[:limit]
