"""`rlkit train` on math-python, a multi-turn tool environment: exact token continuations.

Two short sync steps with the fresh tiny model on a small local arithmetic set. The random model
cannot write tool calls, so the sampling favours `<tool_call>`, `</tool_call>` and the end of
turn: replies then hold (malformed) calls, the environment answers with tool turns and rollouts
run several turns. The bias also enters the engine's processed logprobs, so this run's mismatch
KL says nothing. Each step's metrics must report every rollout as an exact token continuation
sent as token-id prompts, and more than one turn per rollout on average over the run.

A reply makes a tool turn only if it closes a `<tool_call>` pair and ends its turn within
`max_tokens`. At 24 tokens most replies hit the cap, and whether any of the 16 did not came down
to the engine's fixed-seed draws (they changed when a group's first turns became one request),
so replies get 64 tokens.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.helpers.cli import RLKIT
from tests.helpers.session_server import on_session_server

pytestmark = pytest.mark.slow


def write_config(model: Path, tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
            for a in range(1, 5)
            for b in range(1, 5)
        )
    )
    tok = AutoTokenizer.from_pretrained(model)
    bias = {
        str(tok.convert_tokens_to_ids(name)): value
        for name, value in (("<tool_call>", 6.0), ("</tool_call>", 5.0), ("<|im_end|>", 3.0))
    }
    bias_toml = ", ".join(f'"{k}" = {v}' for k, v in bias.items())
    config = tmp_path / "train.toml"
    config.write_text(
        f"""
[model]
path = "{model}"

[[env]]
id = "math-python"
args = {{ dataset = "{data}", max_turns = 4, verify_workers = 1 }}

[orchestrator]
scheduler = "sync"
max_steps = 2
group_size = 4
schedulers.sync.batch_groups = 2
drop_zero_advantage = false
sampling = {{ temperature = 1.0, max_tokens = 64, logit_bias = {{ {bias_toml} }} }}

[orchestrator.eval]
at_start = false
at_end = false

[ckpt]
interval = 0

[log]
run_dir = "{tmp_path / "run"}"
plot = false
"""
    )
    return config


def test_math_python_trains_on_exact_token_continuations(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = write_config(tiny_model_dir, tmp_path)
    log = tmp_path / "train.log"
    with on_session_server(vllm_server, tiny_model_dir) as urls, open(log, "w") as out:
        cmd = [RLKIT, "train", str(config), *urls]
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode
    assert code == 0, log.read_text()[-3000:]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["exact_continuation_frac"] == 1.0 and r["token_prompt_frac"] == 1.0, r
        assert r["rollouts_errored"] == 0 and r["mismatch_kl"] is not None
    assert max(r["turns_per_rollout"] for r in records) > 1.0
