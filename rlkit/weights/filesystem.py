"""The ``filesystem`` weight transport: HF safetensors in the version's directory.

The trainer writes the tensors (one ``model.safetensors``) with the model's config and tokenizer,
so every version directory is a loadable HF model; each server's workers read the files, check
them against the record's tensor table and load them in place. Also the checkpoint format, what a
resumed run loads first, and the copy a broadcast or ipc version falls back to (`write_files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rlkit.atomic import atomic_dir
from rlkit.protocol import handoff
from rlkit.protocol.weights import Named, PublishedVersion, iter_safetensors
from rlkit.weights.transport import (
    TRANSPORTS,
    ModelFiles,
    Outcome,
    Reception,
    ServerAdmin,
    TransportSettings,
    load_files,
)

WEIGHTS_FILE = "model.safetensors"


def save_tensors(directory: Path, tensors: list[Named], model_files: ModelFiles | None) -> None:
    """`tensors` as one safetensors file in `directory`, plus the model's config and tokenizer."""
    from safetensors.torch import save_file

    save_file(dict(tensors), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    if model_files is not None:
        model_files(directory)


def write_files(
    out: Path,
    record: PublishedVersion,
    tensors: list[Named],
    model_files: ModelFiles | None,
    token: str | None,
) -> Path:
    """The filesystem copy of a version sent another way: its tensors and a ``filesystem``
    record (same table and canary, signed with the run's `token`), atomically, marked
    published."""
    copy = record.model_copy(update={"transport": Filesystem.name, "delivery": {}})
    with atomic_dir(out, durable=False) as tmp:
        save_tensors(tmp, tensors, model_files)
        copy.signed(token).write(tmp)
    handoff.mark_published(out)
    return out


@TRANSPORTS.register("filesystem")
class Filesystem:
    """Files in the version's directory; the servers read them (module doc)."""

    name: ClassVar[str] = "filesystem"
    carries_adapters: ClassVar[bool] = True  # a LoRA run's adapters go as files

    def __init__(self, settings: TransportSettings, model_files: ModelFiles | None = None) -> None:
        self.model_files = model_files

    def publish(
        self, tmp: Path, record: PublishedVersion, tensors: list[Named]
    ) -> PublishedVersion:
        save_tensors(tmp, tensors, self.model_files)
        return record

    def published(self, out: Path, record: PublishedVersion, tensors: list[Named]) -> None:
        return None

    def settle(self) -> None:
        return None

    @classmethod
    def receive(
        cls, record: PublishedVersion, directory: Path, reception: Reception
    ) -> list[Named]:
        """The files' tensors, copied out of the files' mapping (safetensors' tensors are views of
        it: a file written over after the check would change what loads), each digested for
        the check while the next is copied; OSError for an unreadable file (safetensors raises
        its own error type, which the worker would not catch: the update would fail instead of
        refusing)."""
        from safetensors import SafetensorError

        tensors: list[Named] = []
        try:
            for name, mapped in iter_safetensors(directory):
                named = (name, mapped.clone())  # private: what is checked is what loads
                reception.arrived([named])
                tensors.append(named)
        except SafetensorError as exc:
            raise OSError(f"unreadable safetensors in {directory}: {exc}") from exc
        return tensors

    @classmethod
    async def deliver(
        cls, servers: list[ServerAdmin], directory: str, record: PublishedVersion
    ) -> list[Outcome]:
        return await load_files(servers, directory, record.version)

    @classmethod
    async def catch_up(cls, server: ServerAdmin, directory: str, record: PublishedVersion) -> bool:
        await server.update_weights(directory, record.version)
        return True
