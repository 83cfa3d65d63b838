"""math-python: the `math` environment's problems and rubric, with a sandboxed `python` tool.

The model may call `python(code)` (a persistent interpreter per rollout, see
`rlkit.envs.python_tool`) any number of times up to `max_turns`, then answers in \\boxed{}.
All other keyword arguments go to `math_env.load_environment` (dataset, num_examples, ...).
"""

from __future__ import annotations

from typing import Any

import math_env

from rlkit.envs.python_tool import PythonToolEnv, with_python_tool

SYSTEM_PROMPT = (
    "Please reason step by step. You can run Python code with the `python` tool to compute or "
    "check intermediate results. Put your final answer within \\boxed{}."
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
    return tool_env
