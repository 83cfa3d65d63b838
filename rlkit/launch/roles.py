"""The roles of `rlkit train` (a module of its own so that the CLI can declare the choices
without importing the launcher, torch or vLLM)."""

from enum import StrEnum


class Role(StrEnum):
    """What one `rlkit train` process runs: everything, or one part for multi-machine runs."""

    ALL = "all"
    INFERENCE = "inference"
    ORCHESTRATOR = "orchestrator"
    TRAINER = "trainer"
