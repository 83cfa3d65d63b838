"""Host directories a sandbox may bind: a private base reachable by the sandbox user, and
per-run writable copies of a source tree.

bubblewrap binds paths as the sandbox user (`nobody` when rlkit runs as root), who cannot
traverse private homes such as /root. Everything a run binds therefore lives under one base
directory owned by this user with mode 0711 (traversable, not listable), by default
`/tmp/rlkit-sandbox-<uid>` (`RLKIT_SANDBOX_DIR` overrides it); a base that someone else owns or
that others can write to is refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlkit.sandbox.launch import SandboxUid, base_dir


def _give_to_sandbox_user(root: Path, uid: int | None) -> None:
    """When running as root the sandbox writes as the copy's own uid: hand the tree over."""
    if uid is None:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


@contextlib.contextmanager
def writable_copy(source: Path) -> Iterator[Path]:
    """A fresh copy of `source` the sandbox can bind read-write (`Mounts.workdir`); removed on
    exit, whatever the sandboxed programs left in it. As root, the copy belongs to a uid of its
    own (`launch.SandboxUid`), which every sandbox bound to it runs as."""
    parent = Path(tempfile.mkdtemp(prefix="work-", dir=base_dir()))
    owner = SandboxUid()
    try:
        parent.chmod(0o711)
        copy = parent / "tree"
        shutil.copytree(source, copy, symlinks=True)
        _give_to_sandbox_user(copy, owner.uid)
        yield copy
    finally:
        shutil.rmtree(parent, ignore_errors=True)
        owner.release()
