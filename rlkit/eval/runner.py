"""Run an eval: n examples x r rollouts against an OpenAI-compatible API, stored as they finish.

The flow is: resolve the environment id once (`resolve_env_id`: the package, its module and its
`[tool.rlkit.eval]` table), load it, apply the package's `[tool.rlkit.eval]` defaults and the
sampling arguments, check the endpoint once (an unreachable URL or an unknown model is a usage
error, not n*r failed rollouts), then run every missing rollout with at most `max_concurrent` in
flight. The rollouts of one example run as one group (`Environment.run_group`, the call
training makes), scored together (group reward functions see the group) and appended to
results.jsonl at once.
Generation failures are recorded on the rollout (the client already retried 429/5xx/timeouts)
and never end the run. Cancelling (Ctrl-C) stops scheduling, cancels what is in flight, marks the
run `interrupted` and raises `EvalInterrupted`; `resume=RUN_DIR` reruns only missing or errored
rollouts, after checking the configuration matches the stored one.
"""

from __future__ import annotations

import asyncio
import difflib
import gc
import os
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

import rlkit
from rlkit.envs import Environment, Rollout
from rlkit.envs.fit import served_fit
from rlkit.envs.loader import load_resolved
from rlkit.envs.resolve import ResolvedEnv, resolve_env_id
from rlkit.errors import UsageError
from rlkit.eval.config import RESULT_FIELDS, EvalConfig
from rlkit.eval.metrics import summarize
from rlkit.eval.package_defaults import apply_package_defaults, package_eval_defaults
from rlkit.eval.store import EvalResult, RunMetadata, RunStore, pending_keys
from rlkit.inference import InferenceClient, InferenceError
from rlkit.inference.client import RETRY_STATUS
from rlkit.progress import print_line
from rlkit.protocol.credentials import read_token
from rlkit.sandbox.preflight import check_sandbox_service


class EvalInterrupted(Exception):
    """The run was cancelled (Ctrl-C); what finished is on disk and `--resume` continues it."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"eval interrupted; resume with: rlkit eval --resume {run_dir}")
        self.run_dir = run_dir


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip("/").split("/")[-1]) or "model"


def new_run_dir(config: EvalConfig) -> Path:
    """`OUTPUT_DIR/ENV--MODEL--DATE-TIME-XXXX`: unique, sortable by date, readable."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    name = f"{_slug(config.env_id)}--{_slug(config.model)}--{stamp}-{uuid.uuid4().hex[:4]}"
    return config.output_dir / name


async def check_endpoint(config: EvalConfig, api_key: str | None) -> None:
    """Fail fast with a UsageError when the API is unreachable, refuses the key or lacks the model.

    An API without a model list (404) or one that is briefly overloaded (429/5xx) is let through:
    the rollouts' own retries and error records handle it.
    """
    async with InferenceClient(
        config.base_url,
        api_key=api_key,
        timeout=min(config.timeout, 15.0),
        max_retries=1,
        max_connections=1,
    ) as probe:
        try:
            served = await probe.models()
        except InferenceError as exc:
            if exc.status is None:
                raise UsageError(
                    f"cannot reach {config.base_url} ({exc}); is the server running? "
                    "Pass its OpenAI-compatible base URL with -b/--base-url"
                ) from exc
            if exc.status in (401, 403):
                raise UsageError(
                    f"{config.base_url} refused the API key (HTTP {exc.status}); put the key in "
                    f"${config.api_key_var} or name another variable with -k (an `rlkit infer` "
                    "server: --token-file FILE, the file it printed)"
                ) from exc
            if exc.status == 404 or exc.status in RETRY_STATUS:
                return
            raise UsageError(f"{config.base_url}: listing models failed: {exc}") from exc
    if served and config.model not in served:
        close = difflib.get_close_matches(config.model, served, n=3, cutoff=0.3) or served[:5]
        raise UsageError(
            f"model {config.model!r} is not served at {config.base_url}; "
            f"did you mean: {', '.join(close)}?"
        )


def check_resumable(config: EvalConfig, metadata: RunMetadata, plan: dict[str, Any]) -> None:
    """Refuse to resume when anything that decides the results differs from the stored run."""
    stored = EvalConfig.model_validate(metadata.config).result_fields()
    wanted = config.result_fields()
    diffs = [
        f"{field}: run has {stored[field]!r}, now {wanted[field]!r}"
        for field in RESULT_FIELDS
        if stored[field] != wanted[field]
    ]
    for key, value in plan.items():
        if getattr(metadata, key) != value:
            diffs.append(f"{key}: run has {getattr(metadata, key)!r}, now {value!r}")
    if diffs:
        raise UsageError(
            f"cannot resume {metadata.env_id} run: its configuration differs:\n  "
            + "\n  ".join(diffs)
        )


class _Tally:
    """Running reward mean and error count for the progress bar."""

    def __init__(self, results: list[EvalResult]) -> None:
        done = [r.rollout for r in results if r.rollout.error is None]
        self.count = len(done)
        self.reward_sum = sum(r.reward for r in done)
        self.errors = 0

    def add(self, rollouts: list[Rollout]) -> None:
        for rollout in rollouts:
            self.count += 1
            self.reward_sum += 0.0 if rollout.error else rollout.reward
            self.errors += rollout.error is not None

    @property
    def mean(self) -> float:
        return self.reward_sum / self.count if self.count else 0.0


def _progress(console: Console | None) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]:.3f}"),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=console is None,
    )


async def _run_pending(
    env: Environment,
    config: EvalConfig,
    rows: list[dict[str, Any]],
    sampling: dict[str, Any],
    pending: dict[int, list[int]],
    store: RunStore,
    client: InferenceClient,
    tally: _Tally,
    progress: Progress,
) -> None:
    # whole groups in flight: max_concurrent rollouts, at least one group
    semaphore = asyncio.Semaphore(max(1, config.max_concurrent // config.rollouts_per_example))
    task = progress.add_task(
        config.env_id,
        total=sum(len(v) for v in pending.values()),
        reward=tally.mean,
        errors=0,
    )

    async def group(index: int, rollout_indexes: list[int]) -> None:
        async with semaphore:
            rollouts = await env.run_group(
                rows[index], client, config.model, sampling, len(rollout_indexes)
            )
        store.append(
            [EvalResult(index, j, r) for j, r in zip(rollout_indexes, rollouts, strict=True)]
        )
        tally.add(rollouts)
        progress.update(task, advance=len(rollouts), reward=tally.mean, errors=tally.errors)

    async with asyncio.TaskGroup() as tasks:
        for index, rollout_indexes in pending.items():
            tasks.create_task(group(index, rollout_indexes))


async def run_eval_async(
    config: EvalConfig, resume: Path | None = None, console: Console | None = None
) -> Path:
    """Run (or resume) an eval and return its run directory; progress goes to `console`. The
    environment is closed when the run ends, however it ends (a bridged one stops its worker)."""
    store: RunStore | None = None
    metadata: RunMetadata | None = None
    if resume is not None:
        store = RunStore(Path(resume))
        metadata = store.read_metadata()
    elif not config.env_id:
        raise UsageError("an environment id is required")
    if not config.model:
        raise UsageError("a model is required (-m/--model)")

    if config.sandbox.serve:
        raise UsageError(
            "sandbox.serve starts a service for an `rlkit train` run; for an eval start "
            "`rlkit sandbox serve` and set sandbox.url and sandbox.token_file"
        )
    config.sandbox.apply()
    resolved = resolve_env_id(config.env_id, install=config.install)
    env = load_resolved(resolved, verifiers_version=config.verifiers_version, **config.env_args)
    try:
        # what the environment asks the sandbox service for, before a run directory exists
        await asyncio.to_thread(check_sandbox_service, [(config.env_id, env)])
        return await _evaluate(env, resolved, config, store, metadata, console)
    finally:
        env.close()


async def _evaluate(
    env: Environment,
    resolved: ResolvedEnv,
    config: EvalConfig,
    store: RunStore | None,
    metadata: RunMetadata | None,
    console: Console | None,
) -> Path:
    """The eval on a loaded environment: a new run when `metadata` is None, else the pending
    rollouts of the run in `store`."""
    config, package_sampling = apply_package_defaults(config, *package_eval_defaults(resolved))
    rows = [dict(row) for row in env.get_eval_dataset(config.num_examples)]
    sampling = config.sampling_args(env.sampling_defaults, package_sampling)
    plan = {"num_examples": len(rows), "sampling": sampling}
    if metadata is not None:
        check_resumable(config, metadata, plan)
    api_key = os.environ.get(config.api_key_var) if config.api_key_var else None
    if config.token_file:
        api_key = read_token(config.token_file)
    await check_endpoint(config, api_key)

    resuming = store is not None and metadata is not None
    if store is None or metadata is None:
        store = RunStore(new_run_dir(config))
        metadata = RunMetadata(
            env_id=config.env_id,
            env_version=env.version,
            env_args=config.env_args,
            model=config.model,
            base_url=config.base_url,
            sampling=sampling,
            num_examples=len(rows),
            rollouts_per_example=config.rollouts_per_example,
            rlkit_version=rlkit.__version__,
        )
    metadata.status = "running"
    metadata.base_url = config.base_url
    metadata.config = config.model_dump(mode="json")
    metadata.summary = None
    store.write_metadata(metadata)
    results = store.compact() if resuming else []
    pending = pending_keys(results, len(rows), config.rollouts_per_example)
    if console is not None:
        if len(rows) < config.num_examples:
            console.print(f"note: the dataset has only {len(rows)} rows; evaluating all of them")
        todo = sum(len(v) for v in pending.values())
        console.print(f"eval run [bold]{store.run_dir}[/]: {todo} rollouts to run")

    # What is loaded now (modules, the environment, its dataset) lives as long as the process:
    # frozen out of the collector's sight, full collections scan only the rollouts' objects
    # (scanning everything paused the event loop: docs/benchmarks.md)
    gc.freeze()
    client = InferenceClient(
        config.base_url,
        api_key=api_key,
        timeout=config.timeout,
        max_retries=config.max_retries,
        max_connections=config.max_concurrent,
    )
    try:
        fit = (
            None if console is None else await served_fit(env, rows, client, config.model, sampling)
        )
        if fit is not None and fit.overlong:  # they still run, so runs stay comparable
            print_line(
                console,
                f"warning: {fit.describe()}; some of their rollouts may end with error `context`: "
                f"{fit.fix('the server')}",
                style="yellow",
            )
        with _progress(console) as progress:
            await _run_pending(
                env, config, rows, sampling, pending, store, client, _Tally(results), progress
            )
    except asyncio.CancelledError:
        store.close()
        metadata.status = "interrupted"
        store.write_metadata(metadata)
        raise EvalInterrupted(store.run_dir) from None
    except BaseException:
        store.close()
        metadata.status = "failed"
        store.write_metadata(metadata)
        raise
    finally:
        await client.aclose()

    results = store.compact()
    metadata.status = "complete"
    metadata.summary = summarize(
        [r.rollout for r in results],
        config.rollouts_per_example,
        threshold=config.pass_threshold,
        metric=config.pass_metric,
    )
    store.write_metadata(metadata)
    return store.run_dir


def run_eval(
    config: EvalConfig, resume: Path | None = None, console: Console | None = None
) -> Path:
    """Synchronous `run_eval_async`: Ctrl-C raises `EvalInterrupted` naming the run directory."""
    return asyncio.run(run_eval_async(config, resume=resume, console=console))
