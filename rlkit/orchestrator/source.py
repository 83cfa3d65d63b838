"""The real rollout source: G rollouts of a handed-out prompt on the next server, scored.

Each group goes to `pool.next()` (round robin by group over the healthy servers). A server that
dies mid-group costs nothing: the pool retries its requests on another server and drops it from
the round robin until it is back (`rlkit.inference.pool`). Only when no server came back within
`inference.recover_timeout_s` does the source raise `ServersLost`, which stops the run.
Environment or reward failures stay on their rollouts (`Rollout.error`).
"""

from __future__ import annotations

from typing import Any

from rlkit.envs import load_environment
from rlkit.envs.sampling import SamplingConfig
from rlkit.errors import UsageError
from rlkit.inference.pool import ClientPool, ServersLost
from rlkit.orchestrator.config import EnvSpec, OrchestratorConfig
from rlkit.orchestrator.prompts import Prompt
from rlkit.orchestrator.scheduler import check_scheduler

__all__ = ["EnvRolloutSource", "ServersLost", "load_environments", "max_rollout_tokens"]


class EnvRolloutSource:
    """`RolloutSource` over real environments and an inference server pool."""

    def __init__(
        self,
        envs: dict[str, Any],
        pool: ClientPool,
        model: str,
        sampling: SamplingConfig,
        group_size: int,
    ) -> None:
        self.envs = envs
        self.pool = pool
        self.model = model
        self.sampling = sampling
        self.group_size = group_size

    async def next_group(self, prompt: Prompt) -> list[Any]:
        env = self.envs[prompt.env_id]
        row = env.get_dataset()[prompt.index]
        rollouts = await env.run_group(
            row, self.pool.next(), self.model, self.sampling.request_args(), self.group_size
        )
        if self.pool.lost is not None:  # its rollouts failed for want of a server
            raise self.pool.lost
        return rollouts

    async def update_weights(self, path: str, version: int) -> None:
        """Load the version published in `path` on every server, through the transport its
        record names (a server that is down catches up on rejoining)."""
        await self.pool.update_weights(path, version)


def load_environments(specs: list[EnvSpec]) -> dict[str, Any]:
    """Load every environment up front; an unknown id is a UsageError naming `env.N.id`."""
    envs: dict[str, Any] = {}
    try:
        for i, spec in enumerate(specs):
            if spec.id in envs:
                raise UsageError(f"env.{i}.id: environment {spec.id!r} is listed twice")
            envs[spec.id] = env = _load_spec(i, spec)
            if env.dataset is None:  # never train on an evaluation set by accident
                raise UsageError(
                    f"env.{i}.args: environment {spec.id!r} has no training set with these "
                    "arguments (only evaluation rows); point it at training data"
                )
    except BaseException:  # what loaded before the refusal keeps no worker
        close_environments(envs)
        raise
    return envs


def _load_spec(i: int, spec: EnvSpec) -> Any:
    """`env.i`'s environment; a load error becomes a UsageError naming the field."""
    try:
        return load_environment(spec.id, verifiers_version=spec.verifiers, **spec.args)
    except UsageError as exc:
        raise UsageError(f"env.{i}.id: {exc}") from exc
    except TypeError as exc:
        raise UsageError(f"env.{i}.args: {exc}") from exc


def close_environments(envs: dict[str, Any]) -> None:
    """Release what each environment holds outside this process (a bridged one's worker)."""
    for env in envs.values():
        env.close()


def max_rollout_tokens(envs: dict[str, Any], o: OrchestratorConfig) -> int:
    """The largest `max_tokens` any environment's requests use (its sampling defaults under
    `orchestrator.sampling`); a UsageError names the field when one has none or exceeds the
    token budget (a rollout the budget cannot hold would never make a batch)."""
    largest = 0
    for env_id, env in envs.items():
        max_tokens = env.sampling_for(o.sampling).get("max_tokens")
        if not max_tokens:
            raise UsageError(
                f"orchestrator.sampling.max_tokens: environment {env_id!r} declares no "
                "max_tokens in its sampling_defaults; set it in the config"
            )
        try:
            check_scheduler(
                o,
                int(max_tokens),
                f"{max_tokens} for {env_id!r}: orchestrator.sampling.max_tokens or the "
                "environment's sampling_defaults",
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        largest = max(largest, int(max_tokens))
    return largest
