"""logic environment throughput: rows generated and rows scored per second, per task and level.

Generation is what `load_environment` pays for training rows (reasoning-gym generator + row
building, fresh seeds, nothing cached); scoring is the environment's rubric on gold replies
(extraction + the task's verifier), the work every rollout costs. Both run in one process, one
task and level at a time. Prints one JSON line: per task the rows/s of each (at every level and
averaged over levels: total rows / total seconds) and `score_over_generate`, their ratio.

    .venv/bin/python tests/benchmarks/bench_logic.py [--rows 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from datasets import Dataset
from logic_env import LogicEnv, load_environment
from logic_env.rows import generate_rows
from logic_env.tasks import LEVEL_NAMES, TASKS

from rlkit.envs.check import play
from rlkit.envs.environment import format_dataset


def measure(task: str, level: str, rows: int, env: LogicEnv) -> tuple[float, float]:
    """(seconds to generate `rows` rows, seconds to score them through the rubric)."""
    start = time.perf_counter()
    generated = generate_rows(task, level, rows, f"bench/{time.time_ns()}")
    generate_s = time.perf_counter() - start
    formatted = list(format_dataset(Dataset.from_list(generated), env.system_prompt))

    async def score_all() -> float:
        start = time.perf_counter()
        for row in formatted:
            rollout, _ = await play(env, row, env.gold_completion(row))
            assert rollout.reward == 1.0, (task, level, rollout.error, rollout.metrics)
        return time.perf_counter() - start

    return generate_s, asyncio.run(score_all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20, help="rows per task and level")
    args = parser.parse_args()
    env = load_environment(num_train_examples=0, num_eval_examples=1)
    result: dict[str, dict[str, float]] = {}
    for task in TASKS:
        totals = [0.0, 0.0]
        figures: dict[str, float] = {}
        for level in LEVEL_NAMES:
            generate_s, score_s = measure(task, level, args.rows, env)
            figures[f"generate_rows_per_s/{level}"] = round(args.rows / generate_s, 1)
            figures[f"score_rows_per_s/{level}"] = round(args.rows / score_s, 1)
            totals[0] += generate_s
            totals[1] += score_s
        rows = args.rows * len(LEVEL_NAMES)
        figures["generate_rows_per_s"] = round(rows / totals[0], 1)
        figures["score_rows_per_s"] = round(rows / totals[1], 1)
        figures["score_over_generate"] = round(totals[0] / totals[1], 1)
        result[task] = figures
    print(json.dumps({"bench": "logic", "rows_per_task_level": args.rows, "tasks": result}))


if __name__ == "__main__":
    main()
