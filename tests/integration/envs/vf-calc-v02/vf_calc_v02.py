"""A multi-turn tool environment in verifiers' 0.2.0 API (client layer, pydantic messages).

Written from that version's documented API only: `vf.ToolEnv(tools=...)`, an async
`setup_state(state)`, a `@vf.stop` condition, and reward functions added with
`Rubric.add_reward_func` that read messages as pydantic models (`message.role`,
`message.content`). The model must call `add` and then state the sum.
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
            state["budget"] = 3
            return await super().setup_state(state)

        @vf.stop
        async def out_of_budget(self, state: vf.State) -> bool:
            return len(state["trajectory"]) >= state["budget"]

    async def correct(completion: vf.Messages, answer: str, state: vf.State) -> float:
        """1.0 when the model's last message states the sum (and setup_state ran)."""
        final = [m for m in completion if m.role == "assistant"][-1]
        return float(answer in (final.content or "") and state["budget"] == 3)

    rubric = vf.Rubric()
    rubric.add_reward_func(correct, weight=1.0)
    return CalcEnv(
        tools=[add],
        dataset=rows,
        eval_dataset=rows,
        system_prompt="Use the add tool, then state the sum.",
        rubric=rubric,
        max_turns=4,
    )
