"""Prompts that do not fit the context: measured with the model's chat template (tool schemas
included), dropped per environment with one line, or refused with the lengths and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset

from rlkit.envs import SingleTurnEnv, ToolEnv
from rlkit.envs.fit import fit_training_sets, max_model_len, measure, renderer_for
from rlkit.errors import UsageError


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def questions(*lengths: int) -> Dataset:
    return Dataset.from_dict(
        {"question": [" ".join(["word"] * n) for n in lengths], "answer": ["x"] * len(lengths)}
    )


def test_max_model_len_comes_from_the_server_flags_else_the_model(tiny_model_dir: Path) -> None:
    assert max_model_len(["--max-num-seqs", "8", "--max-model-len", "512"], "/nowhere") == 512
    assert max_model_len(["--max-model-len=1024"], "/nowhere") == 1024
    assert max_model_len([], str(tiny_model_dir)) is not None  # max_position_embeddings
    assert max_model_len([], "/nowhere") is None
    with pytest.raises(UsageError, match="--max-model-len must be a number"):
        max_model_len(["--max-model-len", "lots"], "/nowhere")


def test_lengths_match_the_token_path_and_include_the_tool_schemas(tiny_model_dir: Path) -> None:
    renderer = renderer_for(str(tiny_model_dir))
    assert renderer is not None
    plain = SingleTurnEnv(dataset=questions(3), env_id="plain")
    tools = ToolEnv([add], dataset=questions(3), env_id="tools")
    row = plain.get_dataset()[0]
    (n_plain,) = measure(plain, [row], renderer, 512, {"max_tokens": 8}).lengths
    assert n_plain == len(renderer.prompt_ids(row["prompt"], None, {}))
    (n_tools,) = measure(tools, [row], renderer, 512, {"max_tokens": 8}).lengths
    assert n_tools == len(renderer.prompt_ids(row["prompt"], tools.tool_schemas, {}))
    assert n_tools > n_plain + 20  # the schema of `add` is in the prompt


def test_overlong_rows_are_dropped_with_one_line(tiny_model_dir: Path) -> None:
    renderer = renderer_for(str(tiny_model_dir))
    env = SingleTurnEnv(dataset=questions(2, 3, 300, 4), env_id="mixed")
    lines: list[str] = []
    reports = fit_training_sets(
        {"mixed": env}, renderer, 200, {"max_tokens": 16}, 0.5, lines.append
    )
    assert len(env.get_dataset()) == 3 and reports["mixed"].overlong == [2]
    (line,) = lines
    assert line.startswith("mixed: dropped 1 of 4 training prompts longer than")
    assert "max_model_len 200 - max_tokens 16 = 184 tokens (longest prompt " in line
    assert str(reports["mixed"].longest) in line


@pytest.mark.parametrize("lengths", [(300, 300), (2, 300, 300)])
def test_all_or_too_many_overlong_rows_are_refused(tiny_model_dir: Path, lengths: tuple) -> None:
    renderer = renderer_for(str(tiny_model_dir))
    env = SingleTurnEnv(dataset=questions(*lengths), env_id="long")
    with pytest.raises(UsageError) as info:
        fit_training_sets({"long": env}, renderer, 200, {"max_tokens": 16}, 0.5, print)
    message = str(info.value)
    longest = max(measure(env, env.get_dataset(), renderer, 200, {"max_tokens": 16}).lengths)
    assert "max_model_len 200 - max_tokens 16 = 184 tokens" in message
    assert f"longest prompt {longest} tokens" in message
    assert f"--max-model-len {longest + 16} or more" in message
    assert "orchestrator.max_overlong_fraction = 0.5" in message
    assert len(env.get_dataset()) == len(lengths)  # nothing dropped when refusing


def test_eval_warns_once_when_prompts_do_not_fit_the_served_context(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import io

    from rich.console import Console
    from transformers import AutoTokenizer

    from rlkit.eval import EvalConfig, load_run
    from rlkit.eval.runner import run_eval
    from tests.helpers.fake_openai import FakeOpenAIServer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = io.StringIO()
    with FakeOpenAIServer(tokenizer=tok, model_root=str(tiny_model_dir), max_model_len=30) as srv:
        config = EvalConfig(
            env_id="reverse-text",
            model="fake-model",
            base_url=srv.url,
            num_examples=3,
            rollouts_per_example=1,
            max_tokens=8,
            output_dir=tmp_path,
        )
        run_dir = run_eval(config, console=Console(file=out, width=80))
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, out.getvalue()
    assert "3 of 3 prompts of reverse-text are longer than max_model_len 30" in warnings[0]
    assert "(the server: --max-model-len" in warnings[0]
    errors = [r.rollout.error for r in load_run(run_dir).results]
    assert errors and all(e and e.startswith("context: ") for e in errors)


def test_env_check_with_a_model_checks_that_the_prompts_fit(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from tests.helpers.cli import run_cli

    check = ["env", "check", "reverse-text", "-n", "1", "--model", str(tiny_model_dir)]
    code, output = run_cli(monkeypatch, capsys, *check, "--max-model-len", "30")
    assert code == 1 and "FAIL " in output and "max_model_len 30 - max_tokens" in output
    code, output = run_cli(monkeypatch, capsys, *check, "--max-model-len", "512")
    assert code == 0 and "prompts fit: the longest of" in output, output


def test_running_servers_context_wins_over_the_launch_flags(tiny_model_dir: Path) -> None:
    """`--role orchestrator` with `inference.urls`: the servers' own max_model_len counts."""
    from transformers import AutoTokenizer

    from rlkit.config import load_config
    from rlkit.launch.config import RLJobConfig, check_environments
    from tests.helpers.cli import DEMO_CONFIG
    from tests.helpers.fake_openai import FakeOpenAIServer

    model = str(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(model)
    with FakeOpenAIServer(models=[model], tokenizer=tok, model_root=model, max_model_len=40) as srv:
        cfg = load_config(
            RLJobConfig, DEMO_CONFIG, [f"--model.path={model}", f"--inference.urls=[{srv.url!r}]"]
        )
        assert "512" in cfg.inference.extra_args  # the launch flags would say 512
        with pytest.raises(
            UsageError, match="prompts of reverse-text are longer than max_model_len 40"
        ):
            check_environments(cfg)
