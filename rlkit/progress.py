"""Console output that reads well both in a terminal and in a log file.

In a terminal rich draws live views (spinners, lines wrapped at the terminal's width). Piped to
a file or a CI log, rich would wrap every line at 80 columns and a spinner would print nothing:
there `print_line` prints each message as exactly one plain line, and `phase` prints what it
waits for when it starts and how long it took when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text


def make_console(stderr: bool = False) -> Console:
    """rlkit's console (CLI, launcher, trainer, orchestrator): on a terminal it wraps to the
    window; piped or logged, every message stays on its own line (a long path is not broken
    where a script or a reader copies it)."""
    console = Console(stderr=stderr)
    console.soft_wrap = not console.is_terminal
    return console


def print_error(console: Console, exc: BaseException) -> None:
    """`error: <exc>` as one unwrapped line, the message not read as markup: how the CLI and the
    trainer end on an error they can explain (the launcher quotes the trainer's line)."""
    console.print(Text.assemble(("error: ", "bold red"), str(exc)), soft_wrap=True)


def print_line(console: Console, message: str, style: str | None = None) -> None:
    """One line, never wrapped (rich emits the style's colour codes on a terminal only)."""
    console.print(message, style=style, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def phase(console: Console, waiting_for: str) -> Iterator[None]:
    """A long phase: a live spinner saying what it waits for on a terminal; elsewhere one line
    when it starts and one when it ends, with the seconds it took."""
    t0 = time.monotonic()
    if console.is_terminal:
        with console.status(f"{waiting_for}..."):
            yield
    else:
        print_line(console, f"{waiting_for}...")
        yield
    print_line(console, f"{waiting_for}: done in {time.monotonic() - t0:.1f}s")
