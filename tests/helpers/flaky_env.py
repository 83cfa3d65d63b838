"""An environment folder whose reward function raises on odd rows (issue 66's tests): a long
message, so a cut line shows; the even rows score by length, so groups carry signal."""

from __future__ import annotations

from pathlib import Path

FLAKY_ENV = """
from datasets import Dataset

from rlkit.envs import Rubric, SingleTurnEnv

LONG = "the grader cannot read this row: " + "x" * 300 + " END"


def picky(completion, answer) -> float:
    if int(answer) % 2:
        raise ValueError(LONG)
    return len(completion[-1]["content"]) % 3 / 2


def load_environment() -> SingleTurnEnv:
    rows = [{"question": f"say {i}", "answer": str(i)} for i in range(8)]
    return SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        rubric=Rubric([picky]),
        sampling_defaults={"max_tokens": 4},
    )
"""
CAUSE = "reward function 'picky' raised ValueError"


def write_flaky_env(folder: Path) -> None:
    """`folder` (named `flaky-env`) as an environment folder: `rlkit eval ./flaky-env`."""
    folder.mkdir(parents=True)
    (folder / "flaky_env.py").write_text(FLAKY_ENV)
    (folder / "pyproject.toml").write_text('[project]\nname = "flaky-env"\nversion = "0.1.0"\n')
