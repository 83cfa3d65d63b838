"""Liveness: a run whose groups carry no learning signal stops instead of spinning forever.

A group has signal when at least one rollout is usable and the rewards are not all equal
(otherwise every advantage is 0). An untrained model that solves nothing, a broken reward
function or an environment whose every rollout errors would otherwise make the scheduler
generate and drop groups forever (`next_batch` never returns). After `warn_groups` consecutive
groups without signal the watchdog logs why (per environment: all rewards equal and their
values, or every rollout errored and the first errors); after `stop_groups` it raises
`NoSignalError`, and the orchestrator stops the run with a resumable checkpoint.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from rich.console import Console

from rlkit.errors import RunStopped
from rlkit.orchestrator.config import OrchestratorConfig
from rlkit.orchestrator.scheduler import scheduler_class
from rlkit.progress import make_console
from rlkit.runs.rollout_errors import error_cause


def _cut(message: str, most: int = 200) -> str:
    """A message's first line, at most `most` characters (the watchdog's line stays short)."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= most else line[: most - 3] + "..."


class NoSignalError(RunStopped):
    """Too many consecutive groups without learning signal; the message says why."""


def watchdog_limits(o: OrchestratorConfig, max_tokens: int) -> tuple[int, int]:
    """(warn_groups, stop_groups): the configured ones, else two and ten batches' worth of
    groups (as many as the scheduler's `groups_per_batch` says one batch takes; `max_tokens`:
    the largest rollout's, after each environment's sampling defaults)."""
    per_batch = scheduler_class(o.scheduler).groups_per_batch(o, max_tokens)
    return o.watchdog.warn_groups or 2 * per_batch, o.watchdog.stop_groups or 10 * per_batch


class NoSignalWatchdog:
    """Counts consecutive groups without signal; logs at `warn_groups`, raises at `stop_groups`."""

    def __init__(self, warn_groups: int, stop_groups: int, console: Console | None = None) -> None:
        self.warn_groups = warn_groups
        self.stop_groups = stop_groups
        self.console = console or make_console(stderr=True)
        self.streak = 0
        self.equal: dict[str, Counter[float]] = defaultdict(Counter)  # env -> reward values
        self.errored: dict[str, Counter[str]] = defaultdict(Counter)  # env -> errors' causes
        self.first: dict[str, str] = {}  # cause -> its first message

    def observe(self, env_id: str, rewards: list[float], errors: list[str]) -> None:
        """One finished group: rewards of its usable rollouts, errors of the others."""
        if rewards and max(rewards) - min(rewards) > 1e-8:
            self.streak = 0
            self.equal.clear()
            self.errored.clear()
            self.first.clear()
            return
        self.streak += 1
        if rewards:
            self.equal[env_id].update(round(r, 6) for r in rewards)
        else:
            for error in errors:
                cause = error_cause(error)
                self.errored[env_id][cause] += 1
                self.first.setdefault(cause, error)
        if self.streak == self.warn_groups:
            self.console.print(f"[bold yellow]warning:[/] {self.explain()}")
        if self.streak >= self.stop_groups:
            raise NoSignalError(
                f"{self.explain()}; stopping (orchestrator.watchdog.stop_groups = "
                f"{self.stop_groups}). Fix the environment or the model, then --resume."
            )

    def explain(self) -> str:
        """Why the last groups had no signal, per environment."""
        parts = []
        for env_id, values in sorted(self.equal.items()):
            shown = ", ".join(f"{v:g} x{n}" for v, n in values.most_common(5))
            parts.append(f"{env_id}: all rewards equal within each group (rewards {shown})")
        for env_id, causes in sorted(self.errored.items()):
            said = "; ".join(
                f"{n} x {cause}" + (f": {_cut(self.first[cause])}" if cause in self.first else "")
                for cause, n in causes.most_common()
            )
            parts.append(
                f"{env_id}: every rollout errored ({said}; every message in full: "
                "run_dir/errors.jsonl)"
            )
        return f"{self.streak} consecutive groups without learning signal: " + " | ".join(parts)
