"""A multi-turn tool environment in verifiers' 0.3.1 API (the classic stack in `verifiers.legacy`).

Written as 0.3.1's `vf-init` template lays a package out (`import verifiers.legacy as vf`,
`load_environment(**kwargs) -> vf.Environment`): `vf.ToolEnv(tools=...)`, an async
`setup_state(state)`, a `@vf.stop` condition, a `@vf.cleanup` handler, and reward functions that
read pydantic messages (`message.role`, `message.content`). The model must call `add` and then
state the sum. Each row's `info` holds the tool call and the final reply a perfect model sends.
"""

import json

import verifiers.legacy as vf
from datasets import Dataset


def load_environment(num_examples: int = 4) -> vf.Environment:
    pairs = [(i + 5, 2 * i + 3) for i in range(num_examples)]
    call = {"id": "call_0", "type": "function"}
    rows = Dataset.from_list(
        [
            {
                "question": f"What is {a} + {b}?",
                "answer": str(a + b),
                "info": {
                    "gold_completion": json.dumps(
                        [
                            {
                                "role": "assistant",
                                "content": "",
                                "tool_calls": [
                                    {
                                        **call,
                                        "function": {
                                            "name": "add",
                                            "arguments": json.dumps({"a": a, "b": b}),
                                        },
                                    }
                                ],
                            },
                            {"role": "assistant", "content": f"The sum is {a + b}."},
                        ]
                    )
                },
            }
            for a, b in pairs
        ]
    )

    def add(a: int, b: int) -> int:
        """Return a + b.

        Args:
            a: First addend.
            b: Second addend.
        """
        return a + b

    class CalcEnv(vf.ToolEnv):
        async def setup_state(self, state: vf.State) -> vf.State:
            state["turn_limit"] = 3  # read by the stop condition and the reward
            return await super().setup_state(state)

        @vf.stop
        async def turn_limit_reached(self, state: vf.State) -> bool:
            return len(state["trajectory"]) >= state["turn_limit"]

        @vf.cleanup
        async def mark_cleaned(self, state: vf.State) -> None:
            state["cleaned"] = True

    async def correct(completion: vf.Messages, answer: str, state: vf.State) -> float:
        """1.0 when the last assistant message holds the sum and setup_state ran."""
        replies = [m.content or "" for m in completion if m.role == "assistant"]
        return 1.0 if replies and answer in replies[-1] and state.get("turn_limit") else 0.0

    async def tool_calls_made(completion: vf.Messages) -> float:
        return float(sum(len(m.tool_calls or []) for m in completion if m.role == "assistant"))

    rubric = vf.Rubric()
    rubric.add_reward_func(correct, weight=1.0)
    rubric.add_metric(tool_calls_made)
    return CalcEnv(
        tools=[add],
        dataset=rows,
        eval_dataset=rows,
        system_prompt="Use the add tool, then state the sum.",
        rubric=rubric,
        max_turns=4,
    )
