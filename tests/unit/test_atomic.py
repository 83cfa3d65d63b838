"""rlkit.atomic: readers see the old or the new content, and failures leave no trace."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rlkit.atomic import atomic_dir, atomic_path, atomic_write, temp_path


def test_write_text_and_bytes_leaves_only_the_target(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "state.json"
    assert atomic_write(target, '{"a": 1}') == target
    assert target.read_text() == '{"a": 1}'
    atomic_write(target, b"\x00\x01", durable=False)
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_temp_name_is_hidden_next_to_the_target_and_carries_the_pid(tmp_path: Path) -> None:
    tmp = temp_path(tmp_path / "step_000001.pt")
    assert tmp.parent == tmp_path and tmp.name.startswith(".step_000001.pt.")
    assert f".{os.getpid()}." in tmp.name and tmp.suffix == ".tmp"
    assert tmp != temp_path(tmp_path / "step_000001.pt")  # two writers never share one


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metadata.json"
    atomic_write(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_directories_are_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "weights" / "step_1"
    with atomic_dir(target) as tmp:
        (tmp / "a.bin").write_bytes(b"1")
        (tmp / "nested").mkdir()
        (tmp / "nested" / "b.txt").write_text("2")
    with atomic_dir(target, durable=False) as tmp:
        (tmp / "c.bin").write_bytes(b"3")
    assert sorted(p.name for p in target.iterdir()) == ["c.bin"]
    with pytest.raises(ValueError), atomic_dir(target) as tmp:
        (tmp / "d.bin").write_bytes(b"4")
        raise ValueError("export failed")
    assert sorted(p.name for p in target.iterdir()) == ["c.bin"]
    assert [p.name for p in target.parent.iterdir()] == ["step_1"]


def test_concurrent_writers_never_expose_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "card.json"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    atomic_write(target, payloads[0])
    seen: set[bytes] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(target.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=atomic_write, args=(target, p)) for p in payloads]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    stop.set()
    reader.join()
    assert seen <= set(payloads) and target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
