"""PythonToolEnv: a ToolEnv whose model can run Python in a sandboxed, stateful interpreter.

Each rollout gets its own `rlkit.sandbox.PythonSession` (one bubblewrap'd interpreter kept alive
for the rollout, so variables and imports persist between `python` calls); it is killed when the
rollout ends, however it ends. `with_python_tool(env)` gives any single-turn environment (e.g.
`math`) the tool while keeping its dataset, parser and rubric.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from rlkit.envs.environment import Environment
from rlkit.envs.rollout import Rollout
from rlkit.envs.tools import ToolEnv
from rlkit.inference import InferenceClient
from rlkit.sandbox.preflight import SandboxAsk
from rlkit.sandbox.runner import require
from rlkit.sandbox.session import CellResult, PythonSession

# The running rollout's interpreter: tool functions only receive their arguments, and each
# rollout runs in its own asyncio task (own context), so a context variable routes the call.
_SESSION: contextvars.ContextVar[PythonSession] = contextvars.ContextVar("python_session")


def format_cell(result: CellResult) -> str:
    """What the model reads back from one `python` call."""
    text = result.output
    notes = {
        "timeout": "TimeoutError: the code ran too long and was stopped.",
        "output_limit": "[output truncated]",
        "memory": "MemoryError: the code ran out of memory.",
        "sandbox_error": "Error: the Python sandbox failed; try again.",
    }
    if result.status in notes and notes[result.status] not in text:
        text = f"{text.rstrip()}\n{notes[result.status]}".lstrip()
    if result.restarted:
        text += "\n[the Python session was restarted: earlier variables and imports are lost]"
    return text if text.strip() else "(no output)"


async def python(code: str) -> str:
    """Run Python code in a persistent sandboxed interpreter and return what it printed.

    Args:
        code: Python source. Variables, functions and imports persist between calls; the value
            of a final bare expression is printed, as in a notebook. No network access.
    """
    session = _SESSION.get(None)
    if session is None:
        raise RuntimeError("the python tool only works inside PythonToolEnv rollouts")
    return format_cell(await session.execute(code))


class PythonToolEnv(ToolEnv):
    """Multi-turn tool use with `python` (plus any `extra_tools`) until the model answers."""

    def __init__(
        self,
        *args: Any,
        extra_tools: list[Callable[..., Any]] | None = None,
        cell_timeout: float = 10.0,
        memory_mb: int = 512,
        output_limit: int = 4096,
        **kwargs: Any,
    ) -> None:
        require()  # no isolation: refuse when the environment loads, with the fix
        super().__init__([python, *(extra_tools or [])], *args, **kwargs)
        self.session_options = {
            "timeout": cell_timeout,
            "memory_mb": memory_mb,
            "output_limit": output_limit,
        }

    def sandbox_asks(self) -> list[SandboxAsk]:
        """One Python session whose cells run up to `cell_timeout` s each (checked against a
        sandbox service's limits before a run starts)."""
        options = self.session_options
        return [SandboxAsk("a python tool cell", options["timeout"], options["memory_mb"])]

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        session = PythonSession(**self.session_options)
        token = _SESSION.set(session)
        try:
            rollout = await super().rollout(row, client, model, sampling)
            if session.lost is not None and rollout.error is None:
                rollout.error = f"sandbox: {session.lost}"  # its interpreter's state is gone
            return rollout
        finally:
            _SESSION.reset(token)
            await session.close()


def with_python_tool(env: Environment, max_turns: int = 10, **options: Any) -> PythonToolEnv:
    """The same tasks and rubric as `env`, but the model may call `python` before answering."""
    shared = ("dataset", "eval_dataset", "parser", "rubric", "sampling_defaults", "env_id")
    tool_env = PythonToolEnv(
        **{name: getattr(env, name) for name in shared}, max_turns=max_turns, **options
    )
    tool_env.version = env.version
    return tool_env
