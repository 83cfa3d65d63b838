"""A model directory made into a policy version as the trainer publishes one by files: its record
(`rlkit.protocol.weights.PublishedVersion`, ``filesystem``) with the tensor table of its
safetensors. A server loads only published versions (`/rlkit/update_weights` refuses a
directory without a record), so a test that loads a plain HF directory publishes it first."""

from __future__ import annotations

from pathlib import Path

from rlkit.protocol.credentials import digest_key, token_from_env
from rlkit.protocol.weights import Canary, PublishedVersion, iter_safetensors


def publish_files(
    directory: Path | str,
    version: int = 0,
    canary: tuple[list[int], list[float]] | None = None,
) -> Path:
    """Write `directory`'s record (its files as they are), and with `canary` (token ids, the
    trainer's logprobs) its canary, signed with the tests' run token (`$RLKIT_TOKEN_FILE`,
    conftest.py), and return `directory`."""
    directory = Path(directory)
    tensors = iter_safetensors(directory)
    token = token_from_env()
    record = PublishedVersion.build(version, "filesystem", tensors, digest_key(token))
    record.signed(token).write(directory)
    if canary is not None:
        ids, logprobs = canary
        scored = Canary(version=version, nonce=record.nonce, token_ids=ids, logprobs=logprobs)
        scored.signed(token).write(directory)
    return directory


def published_link(source: Path | str, out: Path, version: int = 0) -> Path:
    """`source`'s weights (symlinked, never copied: a shared fixture stays untouched) published
    in `out` by files."""
    out.mkdir(parents=True)
    for file in Path(source).glob("*.safetensors"):
        (out / file.name).symlink_to(file.resolve())
    return publish_files(out, version)
