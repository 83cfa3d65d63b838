"""`rlkit train` on a mix of logic and reverse-text: real vLLM server, real trainer, 3 short steps.

A fresh tiny model (no SFT: rewards are near zero, so zero-advantage groups are kept) trains on
both environments. Checked: the run finishes, both environments reach the batches, the step
records carry logic's per-task reward curves, nothing errored, and the final eval reports logic's
reward per task.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import tiny_train_cmd
from tests.helpers.session_server import on_session_server

STEPS = 3
LOGIC_TASKS = ["mini_sudoku", "knights_knaves", "countdown"]

pytestmark = pytest.mark.slow


def test_train_on_logic_and_reverse_text(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = (
        f'{{tasks = {json.dumps(LOGIC_TASKS)}, difficulty = "easy", num_train_examples = 30, '
        "num_eval_examples = 1}"
    )
    log = tmp_path / "train.log"
    # on the session's server: its context is the model's 4,096 tokens (logic's prompts need
    # more than the demo's 512)
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *urls,
            "--log.plot=false",
            f"--orchestrator.max_steps={STEPS}",
            "--orchestrator.schedulers.c3po.capacity=16",
            "--orchestrator.schedulers.c3po.token_budget=128",
            "--orchestrator.drop_zero_advantage=false",  # an untrained model solves nothing
            "--orchestrator.eval.at_start=false",
            "--orchestrator.eval.examples=3",
            "--orchestrator.eval.rollouts_per_example=1",
            "--ckpt.interval=0",
            "--env.1.id=logic",
            "--env.1.weight=1.0",
            f"--env.1.args={args}",
        )
        with open(log, "w") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, log.read_text()[-4000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert sum(r["rollouts_errored"] for r in records) == 0, log.read_text()[-4000:]
    keys = set().union(*records)
    assert {"reward_mean/logic", "reward_mean/reverse-text-lcs"} <= keys
    assert {f"reward_mean/logic/{task}" for task in LOGIC_TASKS} & keys
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    logic_eval = next(e for e in evals if e["env_id"] == "logic")
    assert set(logic_eval["reward_by"]["task"]) == set(LOGIC_TASKS)
