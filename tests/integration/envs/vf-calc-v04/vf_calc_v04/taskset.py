"""A multi-turn tool environment in verifiers' 0.4.0 API (as `vf-init NAME --add-tool` lays it out).

Written from that version's documented API only: a `vf.Taskset` whose `load` yields typed tasks,
a `vf.Toolset` tool server wired in `Taskset.toolsets` (started once, shared by the rollouts:
a per-rollout `Task.toolsets` server works the same but starts a process per rollout), a `setup`
hook, a `@vf.stop` condition, and `@vf.reward` / `@vf.metric` methods scored on the finished
`vf.Trace`. The model must call `add` and then state the sum.
"""

import verifiers.v1 as vf

from vf_calc_v04.servers.tool import CalcToolset


class CalcData(vf.TaskData):
    answer: str
    """The sum the model must state."""


class CalcTask(vf.Task[CalcData]):
    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        trace.info["budget"] = 3

    @vf.stop
    async def out_of_budget(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= trace.info["budget"]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1.0 when the model's last reply states the sum (and `setup` ran)."""
        return float(self.data.answer in trace.last_reply and trace.info.get("budget") == 3)

    @vf.metric
    async def add_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 4
    """How many tasks to build."""
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]  # one server for all rollouts

    def load(self) -> list[CalcTask]:
        pairs = [(i + 2, 3 * i + 1) for i in range(self.config.num_tasks)]
        return [
            CalcTask(
                CalcData(
                    prompt=f"What is {a} + {b}?",
                    system_prompt="Use the add tool, then state the sum.",
                    answer=str(a + b),
                ),
            )
            for a, b in pairs
        ]
