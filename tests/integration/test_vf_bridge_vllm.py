"""verifiers environments through the bridge against the real vLLM CPU server (tiny model).

`rlkit eval` on each era's fixture (no errored rollouts, engine token ids and logprobs in every
turn), and `rlkit train` for two C3PO++ steps on a mix of rlkit-native reverse-text, the
verifiers 0.1.3 vf-reverse-text and the verifiers 0.3.1 vf-calc-v03. The tiny random model
writes no tool calls, so the tool environments end after one turn here; their multi-turn paths
run against the fake server (test_vf_bridge.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import RLKIT, clean_rollouts, run_cli
from tests.helpers.session_server import on_session_server

ENV_PATH = str(Path(__file__).parent / "envs")
pytestmark = [pytest.mark.slow, pytest.mark.venv]


@pytest.mark.parametrize(
    "env_id",
    [
        "vf-reverse-text",
        "vf-calc-classic",
        "vf-calc-state",
        "vf-calc-v02",
        "vf-calc-v03",
        "vf-calc-v04",
    ],
)
def test_verifiers_envs_eval_on_vllm(
    env_id, vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("RLKIT_ENV_PATH", ENV_PATH)
    out = tmp_path / "runs"
    # min_tokens: a random model that samples its end token first returns nothing, and
    # verifiers 0.3 and later record that as the rollout's error (EmptyModelResponseError)
    code, text = run_cli(
        monkeypatch, capsys, "eval", env_id, "-m", str(tiny_model_dir),
        "-b", f"{vllm_server.url}/v1", "-n", "2", "-r", "2", "-t", "16", "-o", str(out),
        "--token-file", str(vllm_server.token_file), "-S", '{"min_tokens": 1}',
    )  # fmt: skip
    assert code in (0, None), text
    for rollout in clean_rollouts(out, expected=4):
        assert rollout.turns
        for turn in rollout.turns:
            assert turn.prompt_token_ids and turn.completion_token_ids
            assert len(turn.completion_logprobs) == len(turn.completion_token_ids)
            assert all(math.isfinite(lp) and lp <= 0 for lp in turn.completion_logprobs)
            assert turn.policy_version_end is not None  # the server's X-Policy-Version


def test_train_on_a_mix_of_native_and_verifiers_envs(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "train.toml"
    config.write_text(
        f"""
[model]
path = "{tiny_model_dir}"

[[env]]
id = "reverse-text"
args = {{ min_len = 3, max_len = 6, num_train_examples = 64, num_eval_examples = 4 }}

[[env]]
id = "vf-reverse-text"
args = {{ num_train_examples = 64, num_eval_examples = 4 }}

[[env]]
id = "vf-calc-v03"
args = {{ num_examples = 16 }}

[orchestrator]
scheduler = "c3po"
max_steps = 2
group_size = 4
schedulers.c3po.capacity = 16
schedulers.c3po.token_budget = 256
drop_zero_advantage = false
sampling = {{ temperature = 1.0, max_tokens = 16, min_tokens = 1 }}  # as in the eval test

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
    log = tmp_path / "train.log"
    env = {**os.environ, "RLKIT_ENV_PATH": ENV_PATH}
    with on_session_server(vllm_server, tiny_model_dir) as urls, open(log, "w") as out:
        code = subprocess.run(
            [RLKIT, "train", str(config), *urls],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=900,
        ).returncode
    assert code == 0, log.read_text()[-3000:]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollouts_errored"] == 0 for r in records), records
    seen = {key for r in records for key in r if key.startswith("reward_mean/")}
    wanted = {"reward_mean/reverse-text", "reward_mean/vf-reverse-text", "reward_mean/vf-calc-v03"}
    assert wanted <= seen, seen
