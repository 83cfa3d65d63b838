"""One sampling precedence for train and eval, and the temperature each turn records.

Environment sampling_defaults < config file < flags; an unset field never overrides the layer
below (the orchestrator once sent its own max_tokens = 256 over math's 2048). The temperature a
request was sent with is recorded on its turn, and the training sample takes it from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset

from rlkit.config import load_config
from rlkit.envs import Rollout, Rubric, SingleTurnEnv, Turn
from rlkit.envs.sampling import SamplingConfig, resolve_sampling
from rlkit.errors import UsageError
from rlkit.eval.config import EvalConfig
from rlkit.inference import InferenceClient
from rlkit.launch.config import RLJobConfig
from rlkit.orchestrator.batching import GroupProcessor
from rlkit.orchestrator.prompts import Prompt
from rlkit.orchestrator.scheduler import Group
from rlkit.orchestrator.source import max_rollout_tokens
from tests.helpers.fake_openai import FakeOpenAIServer

MATH_LIKE = {"temperature": 1.0, "max_tokens": 2048}  # math's sampling_defaults


def env(defaults: dict) -> SingleTurnEnv:
    rows = Dataset.from_dict({"question": ["abc", "xyz"], "answer": ["cba", "zyx"]})
    return SingleTurnEnv(dataset=rows, rubric=Rubric([]), sampling_defaults=defaults)


def train_config(tmp_path: Path, sampling: str, overrides: list[str] | None = None) -> RLJobConfig:
    path = tmp_path / "train.toml"
    path.write_text(
        f'[model]\npath = "/tmp/m"\n[[env]]\nid = "reverse-text"\n'
        f"[orchestrator]\nc3po.token_budget = 4096\nsampling = {{ {sampling} }}\n"
    )
    return load_config(RLJobConfig, path, overrides)


def test_unset_fields_fall_through_to_the_environment(tmp_path: Path) -> None:
    default = train_config(tmp_path, "")
    assert default.orchestrator.sampling.max_tokens is None
    assert env(MATH_LIKE).sampling_for(default.orchestrator.sampling) == MATH_LIKE
    # config file < flags (dotted overrides), each over the environment's defaults
    cfg = train_config(tmp_path, "temperature = 0.7", ["--orchestrator.sampling.max_tokens=64"])
    assert env(MATH_LIKE).sampling_for(cfg.orchestrator.sampling) == {
        "temperature": 0.7,
        "max_tokens": 64,
    }
    # eval: the same rule (environment < package defaults < -t/-T < -S)
    flags = EvalConfig(temperature=0.7, sampling=SamplingConfig(top_p=0.9))
    assert flags.sampling_args(MATH_LIKE, {"max_tokens": 512}) == {
        "temperature": 0.7,
        "max_tokens": 512,
        "top_p": 0.9,
    }
    assert resolve_sampling({"a": 1}, {"a": None, "b": 2}) == {"a": 1, "b": 2}


def test_max_tokens_needs_a_layer_and_fits_the_budget(tmp_path: Path) -> None:
    cfg = train_config(tmp_path, "")
    with pytest.raises(UsageError, match=r"orchestrator\.sampling\.max_tokens: .*'x'"):
        max_rollout_tokens({"x": env({"temperature": 1.0})}, cfg.orchestrator)
    with pytest.raises(UsageError, match=r"token_budget \(4096\).*8192"):
        max_rollout_tokens({"x": env({"max_tokens": 8192})}, cfg.orchestrator)
    both = {"x": env(MATH_LIKE), "y": env({"max_tokens": 16})}
    assert max_rollout_tokens(both, cfg.orchestrator) == 2048


async def test_each_turn_records_its_temperature_and_the_sample_takes_it() -> None:
    e = env({"temperature": 0.5, "max_tokens": 8})
    with FakeOpenAIServer() as server:
        async with InferenceClient(server.url) as client:
            row = e.get_dataset()[0]
            (by_env,) = await e.run_group(row, client, "fake-model", {}, n=1)
            (by_caller,) = await e.run_group(row, client, "fake-model", {"temperature": 0.7}, n=1)
    assert [t.temperature for t in by_env.turns] == [0.5]
    assert by_caller.turns[0].temperature == 0.7
    assert by_caller.training_sample().temperature == 0.7
    proc = GroupProcessor(advantage="grpo", drop_zero_advantage=False, solve_threshold=1.0)
    group = Group(prompt=Prompt(0, "e", 0, 0), start_version=0)
    by_env.reward, by_caller.reward = 1.0, 0.0
    group.rollouts = [by_env, by_caller]
    proc(group)
    assert [s.temperature for s in group.samples] == [0.5, 0.7]


def test_greedy_or_unset_is_one_and_mixed_turns_are_refused() -> None:
    def rollout(*temperatures: float | None) -> Rollout:
        turns = [
            Turn(prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[-0.1])
            for _ in temperatures
        ]
        for turn, t in zip(turns, temperatures, strict=True):
            turn.temperature = t
        return Rollout(turns=turns)

    assert rollout(None).training_sample().temperature == 1.0
    assert rollout(0.0).training_sample().temperature == 1.0
    with pytest.raises(ValueError, match="different temperatures"):
        rollout(0.7, 1.0).training_sample()
