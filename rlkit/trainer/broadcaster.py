"""The trainer's side of ``weight_transfer = "broadcast"``: publish each version's manifest, then
send its tensors from a background thread.

Why a thread: the orchestrator announces who joins only after it sees the version published,
and writes the next batch only after every server has loaded it; the trainer's main thread must
meanwhile go back to waiting for that batch, or the two would wait on each other. One update is
in flight at a time (`publish` first waits for the previous one to settle). When the broadcast
fails, or the orchestrator says some live server did not get a verified update, the thread
writes the filesystem copy of the same version (`FILES_DIR` inside the version's directory) and
tells the orchestrator where. Once the update settled, the thread keeps the gathered CPU tensors
until the next `publish` (one CPU copy of the policy on the exporting rank) to write that copy
for a server that restarts in the meantime (`rlkit.inference.broadcast.request_files`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rlkit.inference.broadcast import BroadcastError, Named, Sender, read_manifest
from rlkit.trainer import dist
from rlkit.trainer.export import write_weight_files

FILES_DIR = "files"
console = Console(stderr=True)


class Broadcaster:
    """Owned by every trainer rank (the export is collective); rank 0 hosts the store."""

    def __init__(self, timeout_s: float, bucket_mb: int, device: str = "cpu") -> None:
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_mb * 2**20
        # torchrun's MASTER_ADDR is where this rank is reachable from the other machines
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.sender = Sender(host, timeout_s, device) if dist.is_main() else None
        self.thread: threading.Thread | None = None
        self.settled = threading.Event()  # the update in flight reached every server, or failed
        self.stop = threading.Event()

    def publish(self, trainer, out: Path, version: int, extra: dict | None = None) -> None:
        """Collective: publish `version`'s manifest in `out` and start sending it (rank 0)."""
        self.wait()

        def manifest(tensors: list[Named]) -> dict:
            assert self.sender is not None
            return self.sender.manifest(version, tensors, self.bucket_bytes)

        tensors = trainer.export_broadcast(out, manifest, extra)
        if tensors is None:  # not the exporting rank
            return
        self.thread = threading.Thread(
            target=self._send, args=(read_manifest(out), tensors, out), daemon=True
        )
        self.thread.start()

    def _send(self, manifest: dict, tensors: list[Named], out: Path) -> None:
        assert self.sender is not None
        version = manifest["version"]
        try:
            reason = self._files_reason(manifest, tensors)
            if reason is not None:
                console.print(
                    f"[yellow]broadcast of version {version}: {escape(reason[:500])}; writing "
                    "its filesystem copy[/]"
                )
                path = write_weight_files(out / FILES_DIR, tensors, out)
                self.sender.serve_files(version, str(path))
        finally:
            self.sender.close_version(version)
            self.settled.set()

    def _files_reason(self, manifest: dict, tensors: list[Named]) -> str | None:
        """Send the update; why its filesystem copy is needed (a failed broadcast, a server
        without a verified update, a server restarted before the next update), or None."""
        assert self.sender is not None
        version = manifest["version"]
        try:
            self.sender.send(manifest, tensors)
        except BroadcastError as exc:
            return str(exc)
        if self.sender.files_wanted(version, self.stop):
            return "a server did not get a verified update"
        self.settled.set()  # every server has it: keep the tensors for one that restarts
        if self.sender.files_requested(version, self.stop):
            return "a server restarted and asks for it"
        return None

    def wait(self) -> None:
        """Let the update in flight settle (at most the timeout, then it is abandoned) and stop
        serving its filesystem copy on request."""
        if self.thread is None:
            return
        self.settled.wait(self.timeout_s)
        self.stop.set()
        self.thread.join()
        self.stop.clear()
        self.settled.clear()
        self.thread = None
