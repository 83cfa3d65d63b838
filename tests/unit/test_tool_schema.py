"""rlkit's own tool schemas (no transformers import, so the lean install runs tool environments)
equal transformers' `get_json_schema`, which chat templates were written against."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from rlkit.envs.tool_schema import ToolSchemaError, get_json_schema


def add(a: int, b: float = 1.0) -> float:
    """Add two numbers.

    Args:
        a: The first number,
            on two lines.
        b: The second number.

    Returns:
        The sum.
    """
    return a + b


def search(
    query: str,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
    weights: dict[str, float] | None = None,
    pair: tuple[int, str] | None = None,
    anything: Any = None,
    either: int | str = 0,
    drink: str = "tea",
) -> list[str]:
    """Search the index.

    Args:
        query: What to look for.
        mode: How to search.
        tags: Tags to filter on.
        weights: Per-field weights.
        pair: A pair.
        anything: Whatever.
        either: A number or a name.
        drink: The beverage (choices: ["tea", "coffee"])
    """
    return []


def bash(command: str) -> str:
    """Run a shell command in the sandbox and return its output.

    Args:
        command: The command line.
    """
    return command


class Tools:
    def method(self, x: bool) -> None:
        """A method.

        Args:
            x: A flag.
        """


@pytest.mark.parametrize("func", [add, search, bash, Tools().method])
def test_same_schema_as_transformers(func: Any) -> None:
    transformers_utils = pytest.importorskip("transformers.utils")
    assert get_json_schema(func) == transformers_utils.get_json_schema(func)


def undocumented(x: int) -> int:
    """No Args section."""
    return x


def unhinted(x) -> int:  # noqa: ANN001
    """Unhinted.

    Args:
        x: A value.
    """
    return x


@pytest.mark.parametrize("func", [undocumented, unhinted])
def test_refusals_name_the_argument(func: Any) -> None:
    with pytest.raises(ToolSchemaError, match="'?x'?"):
        get_json_schema(func)
