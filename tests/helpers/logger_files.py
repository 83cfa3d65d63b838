"""Readers of what the `[log]` sinks write, with each backend's own reader where it has one."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK, FULL, LAST = 32768, 1, 4


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows of the W&B offline run under `run_dir/wandb`, read from its
    `run-ID.wandb` file: a LevelDB-style log (7-byte file header, 32 KiB blocks, records with
    a crc32/length/type header, split across blocks) of wandb's protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, chunk, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # the block's tail is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows
