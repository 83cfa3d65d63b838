"""A pickle that runs a command when loaded: what a checkpoint reader must refuse, not run."""

from __future__ import annotations

import os


class Planted:
    """Unpickled, it touches `marker`: the marker's absence shows the pickle did not run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))
