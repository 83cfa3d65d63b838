"""`BridgeEnv`: an rlkit `Environment` whose rows, rollouts and scores come from a bridge worker.

The worker runs the verifiers environment in its own venv (`venvs.ensure_venv`) and lets
verifiers run its own rollout loop against the inference server rlkit hands it; the turns come
back with the engine's token ids and logprobs (`prompt_mode` "messages": verifiers sends the
whole conversation each turn, so `training_sample` keeps the longest common prefix when a chat
template re-renders history). Rows are fetched once at load (each keeps `info["bridge_row"]`,
the worker's split and index). A worker failure never raises out of `rollout`/`score_group`: the
rollouts are marked errored and the next request restarts the worker. A rollout whose server
died under it (the orchestrator's pool client says so) runs again on another healthy server.
"""

from __future__ import annotations

import json
import os
from typing import Any

from datasets import Dataset

from rlkit.envs.bridge.process import WorkerError, WorkerFailed, WorkerProcess
from rlkit.envs.bridge.source import VfSource
from rlkit.envs.bridge.venvs import ensure_venv
from rlkit.envs.bridge.versions import era_of, select_version
from rlkit.envs.environment import Environment
from rlkit.envs.rollout import Rollout, Turn
from rlkit.errors import UsageError
from rlkit.inference import InferenceClient
from rlkit.progress import make_console, print_line

ROWS_PER_REQUEST = 500
MAX_FAILOVERS = 3  # times one rollout moves to another server of the pool
ROW_KEY = "bridge_row"


def _seconds(var: str, default: float) -> float:
    return float(os.environ.get(var) or default)


class BridgeEnv(Environment):
    """A verifiers environment served by a worker process (see the module docstring)."""

    remote_rollouts = True  # rollouts run in the worker: scripted checks serve it over HTTP

    def __init__(
        self, source: VfSource, env_args: dict[str, Any], verifiers_version: str | None = None
    ) -> None:
        version = select_version(
            source.name, source.verifiers_spec, verifiers_version, api=source.api
        )
        era = era_of(version)
        assert era is not None
        requirements = [*source.requirements, *era.requirements]
        python = ensure_venv(source.name, version, requirements, log=_note)
        spec = {
            "module": source.module,
            "sys_path": source.sys_path,
            "env_args": env_args,
            "shim": era.shim,
        }
        self.verifiers_version = version
        self.rollout_timeout_s = _seconds("RLKIT_BRIDGE_ROLLOUT_TIMEOUT_S", 3600)
        self.worker = WorkerProcess(
            str(python),
            spec,
            ping_interval_s=_seconds("RLKIT_BRIDGE_PING_S", 15),
            ping_timeout_s=_seconds("RLKIT_BRIDGE_PING_TIMEOUT_S", 30),
        )
        try:
            described = self.worker.describe()
        except WorkerFailed as exc:
            self.worker.close()
            raise UsageError(
                f"verifiers environment {source.name!r} (verifiers {version}): {exc}"
            ) from exc
        self.description = described
        splits = {s: self._rows(s, n) for s, n in (described.get("splits") or {}).items() if n}
        super().__init__(
            dataset=splits.get("train"),
            eval_dataset=splits.get("eval"),
            sampling_defaults=described.get("sampling_defaults") or {},
            env_id=source.name,
        )
        self.version = source.version

    def _rows(self, split: str, count: int) -> Dataset | None:
        rows: list[dict[str, Any]] = []
        for start in range(0, count, ROWS_PER_REQUEST):
            chunk = self.worker.call(
                "rows", timeout=600, split=split, start=start, count=ROWS_PER_REQUEST
            )
            rows.extend(chunk)
        for index, row in enumerate(rows):
            row["info"] = {**(row.get("info") or {}), ROW_KEY: {"split": split, "index": index}}
        return Dataset.from_list(rows) if rows else None

    async def rollout(
        self, row: dict[str, Any], client: InferenceClient, model: str, sampling: dict[str, Any]
    ) -> Rollout:
        rollout = self.new_rollout(row)
        ref = rollout.info.get(ROW_KEY) or {}
        fail_over = getattr(client, "fail_over", None)  # a pool's client (the orchestrator's)
        for _ in range(MAX_FAILOVERS + 1):
            try:
                result = await self.worker.acall(
                    "rollout",
                    self.rollout_timeout_s,
                    split=ref.get("split", "eval"),
                    index=int(ref.get("index", 0)),
                    base_url=f"{client.base_url}/v1",
                    api_key=client.api_key or "",
                    model=model,
                    sampling=self.sampling_for(sampling),
                    request_timeout=client.timeout,
                )
            except (WorkerFailed, WorkerError) as exc:
                rollout.error = f"bridge worker: {exc}"
                return rollout
            error = result.get("error") or ""
            # the server died under the rollout: run it again from the start on a healthy one
            if not error.startswith("generation failed") or fail_over is None:
                break
            if not await fail_over(error):
                break
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        for turn in result.get("turns") or []:
            for key in usage:
                usage[key] += int((turn.get("usage") or {}).get(key, 0))
            rollout.turns.append(Turn.model_validate(turn))
        rollout.completion = list(result.get("completion") or [])
        rollout.error = result.get("error")
        rollout.finish_reason = rollout.turns[-1].finish_reason if rollout.turns else None
        rollout.usage.update(usage)
        rollout.timings["total_s"] = float(result.get("total_s") or 0.0)
        rollout.state["bridge"] = (self.worker.generation, result.get("handle"))
        return rollout

    async def score_group(self, rollouts: list[Rollout]) -> None:
        live = [
            r
            for r in rollouts
            if r.error is None and r.state.get("bridge", (None,))[0] == self.worker.generation
        ]
        for r in rollouts:
            if r.error is None and r not in live:
                r.error = "bridge worker restarted before this rollout was scored"
        if not live:
            return
        try:
            scores = await self.worker.acall(
                "score", self.rollout_timeout_s, handles=[r.state["bridge"][1] for r in live]
            )
        except (WorkerFailed, WorkerError) as exc:
            for r in live:
                r.error = f"scoring failed: bridge worker: {exc}"
            return
        for r, score in zip(live, scores, strict=True):
            if score.get("error"):
                r.error = f"scoring failed: {score['error']}"
                continue
            r.reward = float(score["reward"])
            r.metrics = {k: float(v) for k, v in (score.get("metrics") or {}).items()}

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """`info["gold_completion"]` when the package gives one: the assistant messages (a
        list, or its JSON text) or the reply's text. verifiers has no gold-answer hook, so
        without it there is none (a row's `answer` is not a reply the parser accepts)."""
        gold = (row.get("info") or {}).get("gold_completion")
        if isinstance(gold, str):
            try:
                parsed = json.loads(gold)
            except json.JSONDecodeError:
                parsed = None
            gold = parsed if isinstance(parsed, list) else [{"role": "assistant", "content": gold}]
        return list(gold) if gold else None

    def reward_bounds(self) -> tuple[float, float]:
        """From the rubric's weights the worker reports (each function scoring in [0, 1]);
        (0, 1) when the era does not report them (0.4 tasksets)."""
        weights = self.description.get("reward_weights")
        if weights is None:
            return 0.0, 1.0
        return sum(w for w in weights if w < 0), sum(w for w in weights if w > 0)

    def close(self) -> None:
        self.worker.close()


def _note(message: str) -> None:
    print_line(make_console(stderr=True), message, style="dim")
