"""Checks on a directory of HF safetensors (or a LoRA adapter) before it reaches a running engine.

A weight update must never leave the server half-updated, so the directory is validated
up front against the served checkpoint's tensor names, shapes and dtypes (read from the
safetensors headers only, without loading any data).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rlkit.errors import UsageError


def read_safetensors_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Map tensor name -> (dtype, shape) from one safetensors file's JSON header."""
    with open(file, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise UsageError(f"{file}: not a safetensors file (truncated header)")
        (n,) = struct.unpack("<Q", raw_len)
        if n <= 0 or n > 100_000_000:
            raise UsageError(f"{file}: not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{file}: corrupt safetensors header: {exc}") from exc
    size = file.stat().st_size
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        if 8 + n + end > size:
            raise UsageError(f"{file}: truncated data for tensor {name!r}")
        out[name] = (meta["dtype"], tuple(meta["shape"]))
    return out


def weight_signature(directory: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor names, dtypes and shapes of every ``*.safetensors`` file in `directory`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UsageError(f"weights directory not found: {directory}")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UsageError(f"no *.safetensors files in {directory}")
    sig: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        sig.update(read_safetensors_header(file))
    return sig


ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter directory's two files
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def check_adapter_dir(directory: str | Path) -> None:
    """Raise UsageError unless `directory` is a PEFT adapter (config + safetensors weights)."""
    directory = Path(directory)
    if not (directory / ADAPTER_CONFIG).is_file():
        raise UsageError(f"{directory}: no {ADAPTER_CONFIG} (not a PEFT adapter directory)")
    weights = directory / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise UsageError(f"{directory}: no {ADAPTER_WEIGHTS}")
    read_safetensors_header(weights)


def check_signature(
    new: dict[str, tuple[str, tuple[int, ...]]],
    reference: dict[str, tuple[str, tuple[int, ...]]],
    new_dir: str | Path,
) -> None:
    """Raise UsageError (naming `new_dir`) unless `new` has exactly the reference's tensor
    names and shapes (dtypes are the fingerprint's business)."""
    missing = sorted(set(reference) - set(new))
    extra = sorted(set(new) - set(reference))
    if missing:
        raise UsageError(
            f"{new_dir}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
    if extra:
        raise UsageError(
            f"{new_dir}: unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}"
        )
    for name, (_, shape) in reference.items():
        if new[name][1] != shape:
            raise UsageError(
                f"{new_dir}: tensor {name!r} has shape {new[name][1]}, expected {shape}"
            )
