"""A multi-turn tool environment in verifiers' 0.1.9 API (the state-based rollout loop).

Written from that version's documented API only: `vf.ToolEnv(tools=...)`, an async
`setup_state(state)`, a `@vf.stop` condition, and a `vf.Rubric` whose functions read the
`state` (its `trajectory`). The model must call `add` and then state the sum.
"""

import verifiers as vf
from datasets import Dataset


def load_environment(num_examples: int = 4) -> vf.Environment:
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
        return a + b

    class CalcEnv(vf.ToolEnv):
        async def setup_state(self, state: vf.State) -> vf.State:
            state["answered"] = False
            return await super().setup_state(state)

        @vf.stop
        async def stated_answer(self, state: vf.State) -> bool:
            if not state["trajectory"]:
                return False
            last = state["trajectory"][-1]["completion"][-1]
            state["answered"] = state["answer"] in (last.get("content") or "")
            return state["answered"]

    def correct(completion: vf.Messages, answer: str, state: vf.State) -> float:
        """1.0 when the model's last message states the sum (and setup_state ran)."""
        final = [m for m in completion if m["role"] == "assistant"][-1]
        return float(answer in (final.get("content") or "") and "answered" in state)

    def turns(state: vf.State) -> float:
        """Model turns in the trajectory (a metric)."""
        return float(len(state["trajectory"]))

    return CalcEnv(
        tools=[add],
        dataset=rows,
        eval_dataset=rows,
        system_prompt="Use the add tool, then state the sum.",
        rubric=vf.Rubric(funcs=[correct, turns], weights=[1.0, 0.0]),
        max_turns=4,
    )
