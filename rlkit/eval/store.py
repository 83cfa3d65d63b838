"""The on-disk eval run: `metadata.json` (atomic rewrites) and `results.jsonl` (append + flush).

Each results line is a `Rollout.model_dump()` plus `example_index` and `rollout_index`, the key
of a rollout within the run. Lines are appended as results arrive, so an interrupted run keeps
everything it finished. A resumed run appends reruns of the same keys; readers keep the last line
per key, and `compact()` rewrites the file deduplicated and sorted (tmp + rename) at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from rlkit.atomic import atomic_write
from rlkit.envs.rollout import Rollout
from rlkit.errors import UsageError

METADATA = "metadata.json"
RESULTS = "results.jsonl"

Status = Literal["running", "complete", "interrupted", "failed"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class RunMetadata(BaseModel):
    """What was evaluated, how, and how far the run got."""

    status: Status = "running"
    env_id: str
    env_version: str | None = None
    env_args: dict[str, Any] = Field(default_factory=dict)
    model: str
    base_url: str
    sampling: dict[str, Any] = Field(default_factory=dict, description="Resolved sampling args.")
    num_examples: int = Field(description="Rows evaluated (the request capped at dataset size).")
    rollouts_per_example: int
    rlkit_version: str
    created_at: str = Field(default_factory=utc_now)
    updated_at: str = Field(default_factory=utc_now)
    config: dict[str, Any] = Field(default_factory=dict, description="The EvalConfig as given.")
    summary: dict[str, Any] | None = None


@dataclass
class EvalResult:
    """One rollout and its place in the run."""

    example_index: int
    rollout_index: int
    rollout: Rollout

    @property
    def key(self) -> tuple[int, int]:
        return (self.example_index, self.rollout_index)

    def to_json(self) -> str:
        record = self.rollout.model_dump(mode="json")
        record["example_index"] = self.example_index
        record["rollout_index"] = self.rollout_index
        return json.dumps(record, ensure_ascii=False)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> EvalResult:
        record = dict(record)
        example_index = int(record.pop("example_index"))
        rollout_index = int(record.pop("rollout_index"))
        return cls(example_index, rollout_index, Rollout.model_validate(record))


def read_results(path: Path) -> list[EvalResult]:
    """Results of a results.jsonl, last line per key wins, sorted by key.

    A line that does not parse (a write cut short by a crash) is skipped: that rollout counts as
    missing and a resume reruns it.
    """
    by_key: dict[tuple[int, int], EvalResult] = {}
    if not path.exists():
        return []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            try:
                result = EvalResult.from_record(json.loads(line))
            except (json.JSONDecodeError, KeyError, ValueError, ValidationError):
                continue
            by_key[result.key] = result
    return [by_key[k] for k in sorted(by_key)]


def pending_keys(
    results: list[EvalResult], num_examples: int, rollouts_per_example: int
) -> dict[int, list[int]]:
    """Example index -> rollout indexes that are missing or errored (what a resume reruns)."""
    done = {r.key for r in results if r.rollout.error is None}
    pending: dict[int, list[int]] = {}
    for i in range(num_examples):
        missing = [j for j in range(rollouts_per_example) if (i, j) not in done]
        if missing:
            pending[i] = missing
    return pending


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.metadata_path = self.run_dir / METADATA
        self.results_path = self.run_dir / RESULTS
        self._results_file: IO[str] | None = None
        # key -> (result, its line): every result this store has read or appended, so the
        # final compaction writes them out without reading and parsing the file again
        self._known: dict[tuple[int, int], tuple[EvalResult, str]] | None = None

    def read_metadata(self) -> RunMetadata:
        if not self.metadata_path.is_file():
            raise UsageError(f"{self.run_dir} is not an eval run directory (no {METADATA})")
        try:
            return RunMetadata.model_validate_json(self.metadata_path.read_text())
        except ValidationError as exc:
            raise UsageError(f"{self.metadata_path}: malformed eval metadata: {exc}") from exc

    def write_metadata(self, metadata: RunMetadata) -> None:
        metadata.updated_at = utc_now()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.metadata_path, metadata.model_dump_json(indent=2) + "\n")

    def read_results(self) -> list[EvalResult]:
        return read_results(self.results_path)

    def append(self, results: list[EvalResult]) -> None:
        """Append results and flush, so they survive an interrupt or crash."""
        known = self._read_known()
        if self._results_file is None:
            self._results_file = self.results_path.open("a")
        lines = [r.to_json() + "\n" for r in results]
        self._results_file.write("".join(lines))
        self._results_file.flush()
        for result, line in zip(results, lines, strict=True):
            known[result.key] = (result, line)

    def compact(self) -> list[EvalResult]:
        """Rewrite results.jsonl deduplicated and sorted (atomically); returns the results."""
        self.close()
        known = self._read_known()
        keys = sorted(known)
        atomic_write(self.results_path, "".join(known[k][1] for k in keys))
        return [known[k][0] for k in keys]

    def _read_known(self) -> dict[tuple[int, int], tuple[EvalResult, str]]:
        """What the file holds, read once (last line per key wins); appends keep it current."""
        if self._known is None:
            self._known = {r.key: (r, r.to_json() + "\n") for r in self.read_results()}
        return self._known

    def close(self) -> None:
        if self._results_file is not None:
            self._results_file.close()
            self._results_file = None


@dataclass
class EvalRun:
    """A loaded run: its metadata and deduplicated results."""

    run_dir: Path
    metadata: RunMetadata
    results: list[EvalResult]

    @property
    def rollouts(self) -> list[Rollout]:
        return [r.rollout for r in self.results]


def load_run(run_dir: str | Path) -> EvalRun:
    """Load a run directory written by `run_eval` (UsageError when it is not one)."""
    store = RunStore(Path(run_dir))
    metadata = store.read_metadata()
    return EvalRun(store.run_dir, metadata, store.read_results())
