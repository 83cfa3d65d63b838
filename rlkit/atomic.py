"""Atomic writes: a reader sees the old file (or directory) or the new one, never half of one.

Every "write a temporary, then `os.replace` it over the target" in rlkit goes through here, so
there is one temporary-name scheme and one fsync policy:

- Temporary name: `.{target name}.{pid}.{random hex}.tmp`, next to the target (same filesystem,
  so the rename is atomic). The pid and a random part keep two processes, or two threads of one,
  from ever sharing a temporary; the leading dot keeps it out of globs such as `step_*`.
- fsync: `durable=True` (the default) flushes the data to disk before the rename and the parent
  directory after it, so a crash leaves the old or the new content, not an empty file. Only
  files that can be re-created from durable state pass `durable=False` (plots, pid files,
  exported weights, scaffolds); they skip the flush because it costs time on every step.
- On any failure the temporary is removed and the target is left as it was.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path


def temp_path(target: Path) -> Path:
    """A fresh temporary path next to `target` (see the module docstring for the scheme)."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_path(path: Path) -> None:
    """Flush one file or directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file under `root`, then `root` itself."""
    for path in root.rglob("*"):
        if path.is_file():
            fsync_path(path)
    fsync_path(root)


def replace(tmp: Path, target: Path, *, durable: bool = True) -> None:
    """Move a finished temporary file or directory over `target` (a directory is replaced whole)."""
    if durable and tmp.is_dir():
        fsync_tree(tmp)
    elif durable:
        fsync_path(tmp)
    if tmp.is_dir() and target.is_dir():
        shutil.rmtree(target)
    os.replace(tmp, target)
    if durable:
        fsync_path(target.parent)


def _discard(tmp: Path) -> None:
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


@contextmanager
def _published(tmp: Path, target: Path, durable: bool) -> Iterator[Path]:
    """Yield `tmp`; move it over `target` if the block succeeds, else remove it."""
    try:
        yield tmp
        replace(tmp, target, durable=durable)
    except BaseException:
        _discard(tmp)
        raise


def atomic_path(target: str | Path, *, durable: bool = True) -> AbstractContextManager[Path]:
    """A temporary file path to write (e.g. `torch.save(obj, tmp)`) as a context manager; it
    becomes `target` when the block ends without an exception."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return _published(temp_path(target), target, durable)


def atomic_dir(target: str | Path, *, durable: bool = True) -> AbstractContextManager[Path]:
    """A new empty temporary directory to fill, as a context manager; it replaces `target` (and
    everything in it) when the block ends without an exception."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(target)
    tmp.mkdir()
    return _published(tmp, target, durable)


def atomic_write(target: str | Path, data: str | bytes, *, durable: bool = True) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `target` atomically; returns `target`."""
    with atomic_path(target, durable=durable) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(target)
