"""The calculator's MCP tool server (a verifiers 0.4 `vf.Toolset`, shared by the rollouts)."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = None  # advertise `add`, not `calc_toolset_add`

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers and return their sum."""
        return a + b


if __name__ == "__main__":
    CalcToolset.run()
