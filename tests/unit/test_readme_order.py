"""The README in a newcomer's order (issue 66 item 8): the quickstart's two commands first, then
install -> your first environment -> eval -> train -> read the report -> publish, and only then
the operator's material (security, weight transports, several servers and nodes, the sandbox
service)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

NEWCOMER = [
    "Quickstart",
    "Your first environment",
    "Evaluation",
    "Training",
    "Reading a run's report",
    "The hub",
]
OPERATOR = [
    "Security",
    "Inference server and weight sync",
    "Several servers and nodes (multi-node, SLURM)",
    "Sandbox",
]


def headings(text: str) -> list[str]:
    """Top-level sections (`## `), code blocks skipped."""
    found, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("## "):
            found.append(line[3:])
    return found


def test_newcomer_sections_come_first_and_operator_material_after() -> None:
    text = README.read_text()
    order = headings(text)
    assert order[0] == "Quickstart"
    places = [order.index(name) for name in NEWCOMER + OPERATOR]
    assert places == sorted(places), order
    assert max(order.index(n) for n in NEWCOMER) < min(order.index(n) for n in OPERATOR)


def test_the_quickstart_commands_are_at_the_top_and_the_lean_install_is_said() -> None:
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block and first_block.start() < text.index("## The `rlkit` command")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    quickstart = text[text.index("## Quickstart") : text.index("## The `rlkit` command")]
    assert "pip install rlkit" in quickstart and "rlkit[train]" in quickstart
    assert "--template tool" in text[text.index("## Your first environment") :][:600]
