"""A multi-turn tool environment in verifiers' 0.1.3 API (the bridge's classic-era fixture).

Written from that version's documented API only: `vf.ToolEnv(tools=..., max_turns=...)`,
a `setup_state` hook, `is_completed` / `env_response` from the base loop, and a `vf.Rubric`
whose functions take `completion`, `answer` and `state`. The model must call `add` and then
state the sum. `crash_on` / `hang_on` make the tool kill or block the worker for one question
(the bridge's failure tests).
"""

import os
import time

import verifiers as vf
from datasets import Dataset


def load_environment(
    num_examples: int = 4, crash_on: str = "", hang_on: str = ""
) -> vf.Environment:
    pairs = [(i + 2, 3 * i + 1) for i in range(num_examples)]
    rows = Dataset.from_dict(
        {
            "question": [f"What is {a} + {b}?" for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
        }
    )

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The sum of a and b.
        """
        question = f"What is {a} + {b}?"
        if question == crash_on:
            os._exit(3)
        if question == hang_on:
            time.sleep(3600)
        return a + b

    class CalcEnv(vf.ToolEnv):
        async def setup_state(self, state, **kwargs):
            state["tool_budget"] = 2
            return state

    def correct(completion, answer, **kwargs) -> float:
        """1.0 when the last assistant message states the sum."""
        final = [m for m in completion if m["role"] == "assistant"][-1]
        return float(answer in (final.get("content") or ""))

    def used_tool(completion, state, **kwargs) -> float:
        """1.0 when the tool answered and setup_state ran."""
        tool_replies = [m for m in completion if m["role"] == "tool"]
        return float(bool(tool_replies) and state.get("tool_budget") == 2)

    return CalcEnv(
        tools=[add],
        dataset=rows,
        eval_dataset=rows,
        system_prompt="Use the add tool, then state the sum.",
        rubric=vf.Rubric(funcs=[correct, used_tool], weights=[1.0, 0.5]),
        max_turns=4,
    )
