"""The roles of `rlkit train` (a module of its own so that the CLI can declare the choices
without importing the launcher, torch or vLLM)."""

from enum import StrEnum


class Role(StrEnum):
    """What one `rlkit train` process runs: everything, or one part for multi-machine runs."""

    ALL = "all"
    INFERENCE = "inference"
    ORCHESTRATOR = "orchestrator"
    TRAINER = "trainer"
    SANDBOX = "sandbox"  # this node's sandbox service alone (`[sandbox] serve`), for other nodes

    @property
    def starts_sandbox_service(self) -> bool:
        """Whether this role starts its node's sandbox service when `[sandbox] serve` is set
        (a trainer node does not: its CPUs feed the trainer)."""
        return self is not Role.TRAINER

    @property
    def runs_orchestrator(self) -> bool:
        """Whether this role runs the orchestrator here (and so loads the environments)."""
        return self in (Role.ALL, Role.ORCHESTRATOR)

    @property
    def runs_trainer(self) -> bool:
        """Whether this role runs (this node's part of) the trainer here."""
        return self in (Role.ALL, Role.TRAINER)

    def launches_servers(self, urls: list[str] | tuple) -> bool:
        """Whether this role launches inference servers (`all` does unless given their URLs)."""
        return self is Role.INFERENCE or (self is Role.ALL and not urls)
