"""An MCP stdio server runs on this host (this process holds its pipes), on the configured
sandbox backend, even when a sandbox service is configured: a backend that cannot run programs
here refuses the environment at load, not every rollout."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from datasets import Dataset

from rlkit import sandbox
from rlkit.envs.mcp import MCPToolEnv
from rlkit.envs.rubric import Rubric
from rlkit.sandbox.backends import Local
from rlkit.sandbox.runner import SandboxUnavailable


class Unusable(Local):
    """A backend whose runtime is absent here."""

    name: ClassVar[str] = "unusable"

    def problem(self) -> str | None:
        return "the unusable runtime is not installed"


def test_a_stdio_server_is_refused_at_load_on_a_backend_that_cannot_run_here(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "sandbox.token"
    token_file.write_text("t" * 32)
    token_file.chmod(0o600)
    rows = Dataset.from_list([{"question": "q", "answer": "a"}])
    sandbox.configure(backend=f"{__name__}:Unusable")
    sandbox.configure(url="http://127.0.0.1:9", token_file=str(token_file))  # a service
    try:
        with pytest.raises(SandboxUnavailable, match="unusable runtime is not installed"):
            MCPToolEnv(
                eval_dataset=rows,
                rubric=Rubric([]),
                mcp_servers=[{"name": "clock", "command": ["mcp-server-time"]}],
            )
    finally:
        sandbox.configure(backend="bwrap", url="")
