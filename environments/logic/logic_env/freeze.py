"""Write the frozen evaluation set: `python -m logic_env.freeze [ROWS_PER_LEVEL]`.

Rows are interleaved (row 0 of every task and level, then row 1, ...), so the first rows of the
file cover every task at every level. `manifest.json` records the reasoning-gym version and the
generator configs that produced them (draws are selected by `tasks.answer_class`), so a score
today compares with a score next month even after reasoning-gym changes.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from logic_env.rows import generate_rows
from logic_env.tasks import LEVEL_NAMES, TASKS

DATA_DIR = Path(__file__).parent / "data"
EVAL_FILE = DATA_DIR / "eval.jsonl"
MANIFEST_FILE = DATA_DIR / "manifest.json"
EVAL_NAMESPACE = "eval"


def freeze(rows_per_level: int = 10) -> int:
    """Regenerate the eval file and manifest; returns the number of rows written."""
    per_combo = [
        generate_rows(task, level, rows_per_level, EVAL_NAMESPACE, distinct=True)
        for task in TASKS
        for level in LEVEL_NAMES
    ]
    rows = [combo[i] for i in range(rows_per_level) for combo in per_combo]
    DATA_DIR.mkdir(exist_ok=True)
    EVAL_FILE.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    manifest = {
        "reasoning_gym_version": importlib.metadata.version("reasoning-gym"),
        "created": datetime.now(UTC).strftime("%Y-%m-%d"),
        "rows_per_level": rows_per_level,
        "seed_namespace": EVAL_NAMESPACE,
        "levels": {task: levels for task, (_, levels) in TASKS.items()},
        "selection": (
            "distinct questions; answer splits balanced and unserved kinds skipped "
            "(logic_env.tasks.answer_class, logic_env.rows.generate_rows)"
        ),
    }
    MANIFEST_FILE.write_text(json.dumps(manifest, indent=1) + "\n")
    return len(rows)


if __name__ == "__main__":
    count = freeze(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
    print(f"wrote {count} rows to {EVAL_FILE}")
