"""Load a dataset from a hub name, a local data file or a local dataset folder.

Environments take one `dataset_name` string and should not care where it lives: a `.jsonl`,
`.json`, `.parquet` or `.csv` file is read with the matching `datasets` builder, a folder or a
hub name goes to `datasets.load_dataset` as is. Failures become UsageError naming the source.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import datasets
from datasets import Dataset

from rlkit.errors import UsageError


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Hide datasets' tqdm bars (callers such as `rlkit eval` show their own progress)."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_dataset_any(name_or_path: str, split: str = "train") -> Dataset:
    """One split of a dataset given as a hub name, a data file or a dataset folder."""
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix.lower() not in FILE_BUILDERS:
        raise UsageError(
            f"dataset file {path} has an unsupported type; use one of {', '.join(FILE_BUILDERS)}"
        )
    try:
        with quiet_datasets():
            if path.is_file():
                # A single local file has only the split the builder gives it: "train".
                builder = FILE_BUILDERS[path.suffix.lower()]
                return datasets.load_dataset(builder, data_files=str(path), split="train")
            source = str(path) if path.is_dir() else name_or_path
            return datasets.load_dataset(source, split=split)
    except Exception as exc:  # datasets raises many types (missing repo, offline, bad split)
        raise UsageError(f"could not load dataset {name_or_path!r}: {exc}") from exc
