"""math-python: the `math` environment's problems and rubric, with a sandboxed `python` tool.

The model may call `python(code)` (a persistent interpreter per rollout, see
`rlkit.envs.python_tool`) any number of times up to `max_turns`, then answers in \\boxed{}.
All other keyword arguments go to `math_env.load_environment` (dataset, num_examples, ...).
"""

from __future__ import annotations

import json
from typing import Any

import math_env

from rlkit.envs.exploits import Exploit, Variants
from rlkit.envs.python_tool import PythonToolEnv, with_python_tool

SYSTEM_PROMPT = (
    "Please reason step by step. You can run Python code with the `python` tool to compute or "
    "check intermediate results. Put your final answer within \\boxed{}."
)


def _tool_then_guess(env: Any, row: dict[str, Any]) -> Variants:
    """Run the tool on something unrelated, then box a constant or many values: the tool turn
    changes nothing in what the rubric reads."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": "print(0)"})},
    }
    tool = {"role": "assistant", "content": "", "tool_calls": [call]}
    answer = str(row.get("answer") or "").strip()
    finals = {"tool then 0": "\\boxed{0}", "tool then many": "\\boxed{0, 1, 2, 3, 4, 5}"}
    return {
        name: [tool, {"role": "assistant", "content": f"The answer is {text}."}]
        for name, text in finals.items()
        if not (name == "tool then 0" and answer == "0")
    }


TOOL_THEN_GUESS = Exploit(
    "tool then guess",
    _tool_then_guess,
    "a python call that computes nothing, then a boxed constant or many values",
    "math",
)


def load_environment(
    max_turns: int = 8,
    cell_timeout: float = 10.0,
    memory_mb: int = 512,
    system_prompt: str = SYSTEM_PROMPT,
    **math_kwargs: Any,
) -> PythonToolEnv:
    env = math_env.load_environment(system_prompt=system_prompt, **math_kwargs)
    tool_env = with_python_tool(
        env, max_turns=max_turns, cell_timeout=cell_timeout, memory_mb=memory_mb
    )
    tool_env.env_id = "math-python"
    tool_env.verifier = env.verifier  # type: ignore[attr-defined]  # callers may close it
    # the tool is optional: the math gold completion (the boxed reference) answers at once
    tool_env.gold_completion = env.gold_completion  # type: ignore[method-assign]
    tool_env.exploits.extend(env.exploits)  # the math family's (math_env.exploits)
    tool_env.exploits.append(TOOL_THEN_GUESS)
    return tool_env
