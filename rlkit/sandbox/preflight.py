"""Before a run starts: what each environment will ask the sandbox service for, against what the
service allows (issue 66 item 3).

An environment that runs code in the sandbox says what its largest request asks through an
optional method, `sandbox_asks() -> list[SandboxAsk]` (the code environment: one run of a
problem's whole test suite; a Python tool: one cell). When a sandbox service is configured
(`[sandbox] url` / `service_urls`, or `RLKIT_SANDBOX_URL`), its limits are read from its
`/metrics` route (the largest warm pool's timeout and memory) and every ask is checked against
them, so a refusal comes once, naming the fix, before a server or run directory exists, not per
rollout as an errored reward. An in-process sandbox runs whatever the environment asks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from rlkit.errors import UsageError
from rlkit.protocol.credentials import read_token
from rlkit.sandbox.client import service_urls
from rlkit.sandbox.runner import settings

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SandboxAsk:
    """One kind of sandbox request an environment's rollouts make, at its largest."""

    what: str  # e.g. "a problem's 6 tests in one run"
    timeout: float
    memory_mb: int


def asks_of(env_id: str, env: Any) -> list[tuple[str, SandboxAsk]]:
    """(environment id, ask) for `env` and, in an EnvGroup, each member."""
    members = getattr(env, "envs", None)
    if isinstance(members, dict):
        return [pair for sub_id, sub in members.items() for pair in asks_of(sub_id, sub)]
    method = getattr(env, "sandbox_asks", None)
    return [(env_id, ask) for ask in method()] if callable(method) else []


def service_limits(url: str, token_file: str | None) -> tuple[float, int]:
    """(timeout s, memory MiB) of the largest warm pool of the service at `url`."""
    headers = {"Authorization": f"Bearer {read_token(token_file)}"} if token_file else {}
    try:
        reply = httpx.get(f"{url}/metrics", headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise UsageError(
            f"the sandbox service at {url} does not answer ({type(exc).__name__}): start it "
            "(`rlkit sandbox serve`) or point sandbox.url / RLKIT_SANDBOX_URL at a running one"
        ) from None
    if reply.status_code in (401, 403):
        raise UsageError(
            f"the sandbox service at {url} refused the token in {token_file}: set "
            "sandbox.token_file (RLKIT_SANDBOX_TOKEN_FILE) to the service's token file"
        )
    if reply.status_code != 200:
        raise UsageError(f"the sandbox service at {url}: /metrics answered {reply.status_code}")
    pools = reply.json().get("pools") or []
    if not pools:
        raise UsageError(f"the sandbox service at {url} has no warm pool (no --profile)")
    largest = max(pools, key=lambda p: (p["memory_mb"], p["timeout"]))
    return float(largest["timeout"]), int(largest["memory_mb"])


def check_sandbox_service(envs: Iterable[tuple[str, Any]]) -> None:
    """Refuse (UsageError, exit 2) when an environment asks the configured sandbox service for
    more than it allows; nothing to check without a service or without asks."""
    current = settings()
    if not current.url:
        return
    asks = [pair for env_id, env in envs for pair in asks_of(env_id, env)]
    if not asks:
        return
    for url in service_urls(current.url):
        timeout, memory_mb = service_limits(url, current.token_file)
        over = [
            (env_id, ask)
            for env_id, ask in asks
            if ask.timeout > timeout or ask.memory_mb > memory_mb
        ]
        if not over:
            continue
        need_t = math.ceil(max(timeout, *(a.timeout for _, a in over)))
        need_m = max(memory_mb, *(a.memory_mb for _, a in over))
        lines = "; ".join(
            f"{env_id} asks timeout {ask.timeout:g} s / memory_mb {ask.memory_mb} ({ask.what})"
            for env_id, ask in over
        )
        raise UsageError(
            f"the sandbox service at {url} allows at most {timeout:g} s and {memory_mb} MiB per "
            f"request, and {lines}: every such rollout would error. Restart the service with "
            f"`rlkit sandbox serve --profile {need_t}:{need_m}`, or ask less through the "
            'environment\'s arguments (e.g. --env-args \'{"timeout": ..., "memory_mb": ...}\' '
            "for `rlkit eval`, [[env]] args for `rlkit train`)"
        )
