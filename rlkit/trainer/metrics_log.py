"""Per-step metrics as JSONL (one object per step), consistent across a resume.

A run resumed from checkpoint step K re-runs steps K+1...; lines for those steps written
before the crash are dropped first, so every step appears exactly once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlkit.atomic import atomic_write


class MetricsLog:
    def __init__(self, path: Path, resumed_step: int, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._truncate_after(resumed_step)

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        atomic_write(self.path, "".join(line + "\n" for line in kept))

    def append(self, record: dict[str, Any]) -> None:
        """Non-finite numbers (a skipped step's loss) become null: strict JSON for any reader."""
        if self.enabled:
            clean = {
                k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in record.items()
            }
            with open(self.path, "a") as f:
                f.write(json.dumps(clean, allow_nan=False) + "\n")
