"""MCP tool servers in a native environment: the real `mcp-server-time` from the package index
running in the bubblewrap sandbox, and servers that hang or die mid-rollout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from rlkit.envs.check import ScriptedClient
from rlkit.envs.mcp import MCPToolEnv
from rlkit.envs.rubric import Rubric
from rlkit.eval import load_run
from rlkit.sandbox import backends
from tests.helpers.cli import RLKIT, only_run_dir, run_cli
from tests.helpers.mcp_servers import broken_server_dir, install_mcp_server_time
from tests.helpers.session_server import on_session_server
from tests.helpers.system import require_system

pytestmark = [pytest.mark.system, pytest.mark.venv, pytest.mark.slow]


@pytest.fixture(scope="module")
def time_server() -> Iterator[Path]:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    folder = install_mcp_server_time()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _env(servers: list[dict]) -> MCPToolEnv:
    rows = Dataset.from_list([{"question": "What time is it in Paris?", "answer": "Paris"}])
    return MCPToolEnv(eval_dataset=rows, rubric=Rubric([]), mcp_servers=servers, max_turns=3)


def _call(name: str, arguments: dict) -> dict:
    body = json.dumps({"name": name, "arguments": arguments})
    return {"role": "assistant", "content": f"<tool_call>{body}</tool_call>"}


async def test_a_real_mcp_server_answers_tool_calls_from_the_sandbox(time_server: Path) -> None:
    env = _env(
        [
            {
                "name": "time",
                "command": ["python3", "-m", "mcp_server_time", "--local-timezone", "UTC"],
                "pythonpath": [str(time_server)],
            }
        ]
    )
    client = ScriptedClient(
        [
            _call("get_current_time", {"timezone": "Europe/Paris"}),
            _call(
                "convert_time",
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            ),
            {"role": "assistant", "content": "It is morning in Paris."},
        ]
    )
    row = env.eval_dataset[0]
    rollout = await env.rollout(row, client, "m", {})
    assert rollout.error is None, rollout.error
    tools = [m for m in rollout.completion if m["role"] == "tool"]
    assert [t["name"] for t in tools] == ["get_current_time", "convert_time"]
    now = json.loads(tools[0]["content"])
    assert now["timezone"] == "Europe/Paris" and now["datetime"]
    converted = json.loads(tools[1]["content"])
    assert converted["target"]["datetime"].endswith("21:00:00+09:00")
    bad = await env.rollout(
        row,
        ScriptedClient(
            [
                _call("get_current_time", {"timezone": "Mars/Base"}),
                {"role": "assistant", "content": "ok"},
            ]
        ),
        "m",
        {},
    )
    assert bad.error is None
    assert "Error" in [m for m in bad.completion if m["role"] == "tool"][0]["content"]


@pytest.mark.parametrize("mode", ["hang", "die"])
async def test_a_server_that_hangs_or_dies_errors_the_rollout(mode: str) -> None:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    folder = broken_server_dir()
    env = _env(
        [
            {
                "name": "broken",
                "command": ["python3", "-m", "broken_mcp", mode],
                "pythonpath": [str(folder)],
                "timeout_s": 3,
            }
        ]
    )
    script = [_call("echo", {"text": "hi"}), {"role": "assistant", "content": "done"}]
    row = env.eval_dataset[0]
    rollout = await asyncio.wait_for(env.rollout(row, ScriptedClient(script), "m", {}), 60)
    expected = "did not answer tools/call" if mode == "hang" else "exited"
    assert rollout.error is not None and expected in rollout.error
    if mode == "die":
        assert "dying on purpose" in rollout.error
    shutil.rmtree(folder, ignore_errors=True)


async def test_a_server_that_does_not_start_errors_only_its_rollout() -> None:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))
    env = _env([{"name": "missing", "command": ["python3", "-m", "no_such_module_xyz"]}])
    script = [{"role": "assistant", "content": "done"}]
    rollout = await asyncio.wait_for(
        env.rollout(env.eval_dataset[0], ScriptedClient(script), "m", {}), 90
    )
    assert rollout.error is not None and "no_such_module_xyz" in rollout.error


CITIES = ["Europe/Paris", "Asia/Tokyo", "America/New_York"]
ENV_MODULE = """
from datasets import Dataset
from transformers import AutoTokenizer

from rlkit.envs.mcp import MCPToolEnv
from rlkit.envs.rubric import Rubric
from rlkit.eval import load_run

CITIES = ["Europe/Paris", "Asia/Tokyo", "America/New_York"]


def named_the_zone(completion, answer) -> float:
    return float(any(answer in str(m.get("content")) for m in completion))


def load_environment(server_dir: str, **kwargs):
    rows = Dataset.from_list(
        [{"question": f"What time is it in {c}? Call get_current_time.", "answer": c}
         for c in CITIES]
    )
    command = ["python3", "-m", "mcp_server_time", "--local-timezone", "UTC"]
    server = {"name": "time", "command": command, "pythonpath": [server_dir]}
    return MCPToolEnv(dataset=rows, eval_dataset=rows, rubric=Rubric([named_the_zone]),
                      mcp_servers=[server], max_turns=2)
"""


def test_rlkit_eval_of_an_mcp_environment_against_the_real_tiny_model(
    time_server, vllm_server, tiny_model_dir, tmp_path, monkeypatch, capsys
) -> None:
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "mcp_time_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    code, output = run_cli(
        monkeypatch, capsys, "eval", "mcp-time-env", "-m", str(tiny_model_dir),
        "-b", vllm_server.url, "--token-file", str(vllm_server.token_file),
        "-n", "3", "-r", "1", "-t", "32", "-a", json.dumps({"server_dir": str(time_server)}),
        "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0, output
    run = load_run(only_run_dir(tmp_path / "out"))
    assert len(run.results) == 3 and run.metadata.summary["errors"] == 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for result in run.results:
        prompt = tokenizer.decode(result.rollout.turns[0].prompt_token_ids)
        assert "get_current_time" in prompt and "convert_time" in prompt  # schemas rendered


# The random tiny model writes no well-formed tool call, so the training run constrains its
# replies (vLLM's structured outputs) to a call of get_current_time on one of the three zones:
# the engine still samples every token (which zone, how the text is split into tokens), the
# environment parses the call and the real server answers it. The constraint enters the
# engine's processed logprobs, so this run's mismatch KL says nothing.
FORCED_CALL = (
    r'<tool_call>\{"name": "get_current_time", "arguments": \{"timezone": '
    r'"(Europe/Paris|Asia/Tokyo|America/New_York)"\}\}</tool_call>'
)


def test_rlkit_train_of_an_mcp_environment_on_the_session_server(
    time_server, vllm_server, tiny_model_dir, tmp_path
) -> None:
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "mcp_time_env.py").write_text(ENV_MODULE)
    run_dir = tmp_path / "run"
    config = tmp_path / "train.toml"
    config.write_text(
        f"""
[model]
path = "{tiny_model_dir}"

[[env]]
id = "mcp-time-env"
args = {{ server_dir = "{time_server}" }}

[orchestrator]
scheduler = "sync"
max_steps = 2
group_size = 2
schedulers.sync.batch_groups = 2
drop_zero_advantage = false

[orchestrator.sampling]
temperature = 1.0
max_tokens = 96
structured_outputs = {{ regex = '{FORCED_CALL}' }}

[orchestrator.eval]
at_start = false
at_end = false

[ckpt]
interval = 0

[log]
run_dir = "{run_dir}"
plot = false
samples_every = 1
samples_per_step = 4
"""
    )
    log = tmp_path / "train.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path / "pkgs"), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        ),
    }
    with on_session_server(vllm_server, tiny_model_dir) as urls, open(log, "w") as out:
        cmd = [RLKIT, "train", str(config), *urls]
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)
    assert done.returncode == 0, log.read_text()[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollouts_errored"] == 0 for r in records), records
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2}
    for sample in samples:  # each rollout's call reached the server, which answered it
        assert "tool: {" in sample["completion"], sample
        start = sample["completion"].index("tool: {") + len("tool: ")
        answer, _ = json.JSONDecoder().raw_decode(sample["completion"], start)
        assert answer["timezone"] in CITIES and answer["datetime"], sample
