"""`[sandbox]` in eval and train configs: the backend and memory cap, or a sandbox service;
applied at run start."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field, field_validator, model_validator

from rlkit.config import Config
from rlkit.sandbox.backends import backend_class
from rlkit.sandbox.runner import SandboxSettings, settings, use

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class SandboxConfig(Config):
    """Overrides of the process-wide sandbox settings (unset fields keep the environment
    variables' or built-in defaults)."""

    backend: str | None = Field(
        None,
        description="bwrap (isolated, the default), local (NO isolation, explicit opt-in), an "
        "entry point in group rlkit.sandbox_backends, or 'my_pkg.my_module:MyBackend'; "
        "unset: RLKIT_SANDBOX_BACKEND, else bwrap.",
    )
    total_memory_mb: int | None = Field(
        None, ge=1, description="Memory cap of one sandbox's whole process tree (default 2048)."
    )

    url: str | None = Field(
        None,
        description="A sandbox service (`rlkit sandbox serve`), e.g. http://127.0.0.1:8790: "
        "programs and Python sessions run there; unset: RLKIT_SANDBOX_URL, else in-process.",
    )
    service_urls: list[str] = Field(
        default_factory=list,
        description="Several sandbox services (one token_file for all), e.g. "
        '["http://node1:8790", "http://node2:8790"]: each program goes to the least loaded, '
        "and to another when its service dies; instead of url (RLKIT_SANDBOX_URL may name "
        "several, comma-separated).",
    )
    token_file: str | None = Field(
        None, description="The sandbox service's token file (mode 0600); required with url."
    )
    serve: bool = Field(
        False,
        description="`rlkit train` only: every rlkit train process of the run (the orchestrating "
        "one, each --role inference node, each --role sandbox node) starts one sandbox service on "
        "its node, its token the run's (RUN_DIR/sandbox.token), stopped with that process; the "
        "rollouts go to the orchestrator's own service and to the service_urls of the others.",
    )
    serve_args: list[str] = Field(
        default_factory=list,
        description="Extra `rlkit sandbox serve` flags for that service, e.g. "
        '["--concurrency", "8", "--pool-size", "8"].',
    )
    serve_host: str = Field(
        "127.0.0.1",
        description="Address each node's service listens on: loopback (one node), or the "
        "node's address / 0.0.0.0 for services other nodes' orchestrator uses (every request "
        "still needs the run's sandbox token).",
    )
    serve_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of each node's service; 0: a free one (loopback only: another node "
        "must know the port to name it in service_urls).",
    )

    @model_validator(mode="after")
    def _url_has_token(self) -> SandboxConfig:
        if self.url and self.service_urls:
            raise ValueError("set sandbox.url or sandbox.service_urls, not both")
        if self.url and not self.token_file:
            raise ValueError("sandbox.token_file is required with sandbox.url")
        if self.serve:
            if self.url:
                raise ValueError(
                    "sandbox.serve starts the run's own service: leave sandbox.url unset (other "
                    "nodes' services of the run go in sandbox.service_urls)"
                )
            if self.token_file:
                raise ValueError(
                    "sandbox.token_file: the services sandbox.serve starts use the run's token "
                    "(RUN_DIR/sandbox.token); leave it unset"
                )
            if self.serve_port == 0 and self.serve_host not in LOOPBACK:
                raise ValueError(
                    f"sandbox.serve_port: a service on {self.serve_host} is for other nodes, "
                    "which must know its port; set one"
                )
        elif self.service_urls and not self.token_file:
            raise ValueError("sandbox.token_file is required with sandbox.service_urls")
        return self

    @property
    def service_url(self) -> str | None:
        """`url`, or `service_urls` joined as the client reads several (comma-separated)."""
        return ",".join(self.service_urls) if self.service_urls else self.url

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str | None) -> str | None:
        if name is not None:
            backend_class(name)  # ValueError: unknown, unimportable, or not a Backend
        return name

    def settings(self, base: SandboxSettings) -> SandboxSettings:
        """`base` (the environment's settings) with this table's fields that are set."""
        changes = {
            "backend": self.backend,
            "total_memory_mb": self.total_memory_mb,
            # with `serve` the launcher points the client at the run's services once they are up
            "url": None if self.serve else self.service_url,
            "token_file": self.token_file if self.service_url and not self.serve else None,
        }
        return replace(base, **{k: v for k, v in changes.items() if v is not None})

    def apply(self) -> None:
        """Make these the process's sandbox settings before the run loads its environments;
        those that run untrusted code call `rlkit.sandbox.require()` when they load."""
        use(self.settings(settings()))
