"""`rlkit env check`: validate an environment against known answers through its own rollout.

Each case plays scripted assistant messages through the environment's real `rollout` (tools
really execute) with `ScriptedClient` standing in for the model, then scores the rollout with
the environment's rubric: the gold completion (`Environment.gold_completion`) must score the
maximum reward, an empty and a garbage reply the minimum, and nothing may error. A bridged
(verifiers) environment gets the same scripts over HTTP (`scripted_server`), through its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlkit.envs.environment import Environment, Messages
from rlkit.envs.group import EnvGroup
from rlkit.envs.rollout import Rollout
from rlkit.envs.scripted_server import ScriptedServer
from rlkit.inference import Generation, InferenceClient, InferenceError

CaseKind = Literal["gold", "empty", "garbage"]
GARBAGE_REPLY = "◇◆◇ ¤¤ ⊥⊥ ∴∵ ◆◇◆"
SCRIPTED_MODEL = "scripted"
TOLERANCE = 1e-6
# verifiers (0.2 and later) errors a rollout whose reply is empty as the model's fault; for a
# bridged environment that is the empty case's expected outcome
EMPTY_REPLY_REFUSED = "EmptyModelResponseError"


class ScriptedClient:
    """Answers each chat request with the next scripted assistant message.

    It implements the part of `InferenceClient` that rollouts use (`chat`) and cannot take token
    prompts, so multi-turn rollouts keep sending messages. With `repeat=True` the last message
    answers every further turn (a model that always says the same thing); otherwise a request
    past the end of the script fails the rollout with an `InferenceError`.
    """

    supports_token_prompts = False

    def __init__(self, script: Messages, repeat: bool = False) -> None:
        if not script:
            raise ValueError("a scripted client needs at least one message")
        self.script = [dict(m) for m in script]
        self.repeat = repeat
        self.calls = 0

    def next_message(self) -> dict[str, Any]:
        """The next scripted assistant message (raises `InferenceError` past the script)."""
        if self.calls >= len(self.script) and not self.repeat:
            raise InferenceError(
                f"the script has {len(self.script)} assistant message(s) but the environment "
                f"asked for model turn {self.calls + 1}"
            )
        message = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return {"role": "assistant", **{k: v for k, v in message.items() if v is not None}}

    async def chat(
        self,
        messages: Messages,
        model: str,
        sampling: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Generation:
        message = self.next_message()
        return Generation(
            text=message.get("content") or "",
            prompt_token_ids=[],
            completion_token_ids=[],
            completion_logprobs=[],
            finish_reason="tool_calls" if message.get("tool_calls") else "stop",
            message=message,
        )


class CaseResult(BaseModel):
    """One scripted reply on one row, scored."""

    example_id: int | str = Field(0, description="The row's example_id.")
    kind: CaseKind = Field("gold", description="gold, empty or garbage.")
    reward: float | None = Field(None, description="Rubric reward (None when not run).")
    expected: float = Field(0.0, description="The reward this case must score.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Rubric metrics.")
    problem: str | None = Field(None, description="Why the case is not as expected; None: ok.")
    info: dict[str, Any] = Field(default_factory=dict, description="Short fields of row info.")

    @property
    def ok(self) -> bool:
        return self.problem is None


class CheckReport(BaseModel):
    """Everything `rlkit env check` found about one environment."""

    env_id: str = Field("", description="Environment id.")
    train_size: int | None = Field(None, description="Training rows (None: no training set).")
    eval_size: int | None = Field(None, description="Evaluation rows (None: no eval set).")
    split: str = Field("eval", description="Split the checked rows came from.")
    sample: dict[str, Any] = Field(default_factory=dict, description="The first checked row.")
    cases: list[CaseResult] = Field(default_factory=list, description="Every case run.")

    @property
    def ok(self) -> bool:
        return all(case.ok for case in self.cases)

    @property
    def failures(self) -> list[CaseResult]:
        return [case for case in self.cases if not case.ok]

    def summary(self) -> dict[str, tuple[int, int]]:
        """kind -> (cases as expected, cases run)."""
        counts: dict[str, tuple[int, int]] = {}
        for case in self.cases:
            good, total = counts.get(case.kind, (0, 0))
            counts[case.kind] = (good + case.ok, total + 1)
        return counts


def _short_info(info: dict[str, Any]) -> dict[str, Any]:
    """Scalar info fields short enough for a report line (task names, levels, ids)."""
    return {
        k: v
        for k, v in info.items()
        if isinstance(v, (str, int, float, bool)) and len(str(v)) <= 40
    }


def _target(env: Environment, row: dict[str, Any]) -> Environment:
    """The environment that runs `row` (a group's member)."""
    return env.member(row.get("info") or {}) if isinstance(env, EnvGroup) else env


def _remote(env: Environment) -> bool:
    """Whether the environment's rollouts run in another process (the verifiers bridge) and so
    need the scripted replies served over HTTP."""
    return bool(getattr(env, "remote_rollouts", False))


async def play(
    env: Environment,
    row: dict[str, Any],
    script: Messages,
    repeat: bool = False,
    server: ScriptedServer | None = None,
) -> tuple[Rollout, ScriptedClient]:
    """Roll `row` out with scripted replies and score it alone (a group of one); `server`
    serves them to an environment whose rollouts run out of process."""
    scripted = ScriptedClient(script, repeat=repeat)
    client: Any = scripted
    model = SCRIPTED_MODEL
    if server is not None:
        client, model = InferenceClient(server.url), server.register(scripted.next_message)
    rollout = await env.rollout(row, client, model, {})
    await env.score_group([rollout])
    return rollout, scripted


async def check_case(
    env: Environment, row: dict[str, Any], kind: CaseKind, server: ScriptedServer | None = None
) -> CaseResult:
    """Run one case on one row and say whether it scored as expected."""
    low, high = _target(env, row).reward_bounds()
    result = CaseResult(
        example_id=row.get("example_id", 0),
        kind=kind,
        expected=high if kind == "gold" else low,
        info=_short_info(dict(row.get("info") or {})),
    )
    if kind == "gold":
        try:
            script = env.gold_completion(row)
        except Exception as exc:  # a broken gold hook is a finding, not a crash of the check
            result.problem = f"gold_completion raised {type(exc).__name__}: {exc}"
            return result
        if not script:
            result.problem = "the environment provides no gold completion for this row"
            return result
        rollout, client = await play(env, row, script, server=server)
        if rollout.error is None and client.calls < len(script):
            rollout.error = (
                f"the rollout ended after {client.calls} model turn(s) but the gold completion "
                f"has {len(script)}"
            )
    else:
        reply = "" if kind == "empty" else GARBAGE_REPLY
        script = [{"role": "assistant", "content": reply}]
        rollout, _ = await play(env, row, script, repeat=True, server=server)
    result.reward = rollout.reward
    result.metrics = dict(rollout.metrics)
    if kind == "empty" and EMPTY_REPLY_REFUSED in (rollout.error or ""):
        result.reward = None  # verifiers refused the empty reply itself: as expected
    elif rollout.error is not None:
        result.problem = f"errored: {rollout.error}"
    elif abs(rollout.reward - result.expected) > TOLERANCE:
        result.problem = f"reward {rollout.reward:.4g}, expected {result.expected:.4g}"
    return result


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(row, default=str))


async def check_rows(
    env: Environment,
    rows: Iterable[dict[str, Any]],
    gold: bool,
    max_concurrent: int = 8,
) -> list[CaseResult]:
    """Empty and garbage replies (and gold completions with `gold`) on every row."""
    kinds: list[CaseKind] = ["gold", "empty", "garbage"] if gold else ["empty", "garbage"]
    semaphore = asyncio.Semaphore(max_concurrent)

    async def bounded(row: dict[str, Any], kind: CaseKind, server: Any) -> CaseResult:
        async with semaphore:
            remote = _remote(_target(env, row))
            return await check_case(env, row, kind, server if remote else None)

    rows = list(rows)
    remote = any(_remote(_target(env, row)) for row in rows)
    with ScriptedServer() if remote else contextlib.nullcontext() as server:
        cases = (bounded(row, kind, server) for row in rows for kind in kinds)
        return list(await asyncio.gather(*cases))


def check_environment(env: Environment, **options: Any) -> CheckReport:
    """`check_environment_async` (same keyword options) run to completion from sync code."""
    return asyncio.run(check_environment_async(env, **options))


async def check_environment_async(
    env: Environment,
    num_rows: int = 10,
    gold: bool = False,
    split: Literal["eval", "train"] = "eval",
    max_concurrent: int = 8,
) -> CheckReport:
    """Check the first `num_rows` rows of a split (the other split when it is missing)."""
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    if (env.eval_dataset if split == "eval" else env.dataset) is None:
        split = "train" if split == "eval" else "eval"
    dataset = env.get_eval_dataset(num_rows) if split == "eval" else env.get_dataset(num_rows)
    rows = [dict(row) for row in dataset]
    report = CheckReport(
        env_id=env.env_id,
        train_size=None if env.dataset is None else len(env.dataset),
        eval_size=None if env.eval_dataset is None else len(env.eval_dataset),
        split=split,
        sample=_json_safe(rows[0]) if rows else {},
    )
    report.cases = await check_rows(env, rows, gold, max_concurrent)
    return report


def report_lines(report: CheckReport, max_failures: int = 50) -> list[str]:
    """A plain-text report: sizes, a sample row, counts per case kind, then each failure."""
    sample = json.dumps(report.sample, ensure_ascii=False)
    lines = [
        f"environment {report.env_id}: train rows {report.train_size}, "
        f"eval rows {report.eval_size} (checking the {report.split} split)",
        f"sample row: {sample[:600]}{'...' if len(sample) > 600 else ''}",
    ]
    for kind, (good, total) in report.summary().items():
        lines.append(f"{kind}: {good}/{total} as expected")
    failures = report.failures
    for case in failures[:max_failures]:
        where = " ".join(f"{k}={v}" for k, v in case.info.items())
        lines.append(f"FAIL row {case.example_id} [{case.kind}] {where}: {case.problem}")
    if len(failures) > max_failures:
        lines.append(f"... and {len(failures) - max_failures} more failures")
    lines.append("OK" if report.ok else f"{len(failures)} case(s) not as expected")
    return lines
