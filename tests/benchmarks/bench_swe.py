"""The swe environment's costs: seconds per graded rollout, tool-call overhead, factory speed.

- graded rollouts: gold rollouts (str_replace calls + submit, scripted through the fake OpenAI
  server) on `--tasks` shipped tasks of each repository, one at a time: wall seconds per rollout,
  overall and per repository.
- tool overhead: p50/p95 wall ms of `bash("true")` through the tool path (a fresh bubblewrap
  sandbox with the repository bound) next to a bare `rlkit.sandbox.run` of `true` (ratio), and
  of `view` (host side, no sandbox).
- factory: tasks validated per minute by `swe_env.make_tasks` on `--factory-repo`.

Prints one JSON line.

    .venv/bin/python tests/benchmarks/bench_swe.py [--tasks 3] [--calls 40] [--factory-count 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from swe_env import SHIPPED, RepoSession, load_tasks
from swe_env.env import SWEEnv
from swe_env.make_tasks import make

from rlkit import sandbox
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer, replay


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def graded_rollouts(per_repo: int) -> dict[str, object]:
    shipped = load_tasks(SHIPPED)
    tasks = []
    for repo in sorted({t.repo for t in shipped}):
        tasks += [t for t in shipped if t.repo == repo][:per_repo]
    env = SWEEnv(tasks, env_id="swe")
    rows = list(env.get_dataset())
    scripts = {r["prompt"][-1]["content"]: env.gold_completion(r) for r in rows}
    per_repo_s: dict[str, list[float]] = {}
    rewards = []
    with FakeOpenAIServer(responder=replay(scripts)) as server:
        client = InferenceClient(server.url)
        for row, task in zip(rows, tasks, strict=True):
            start = time.perf_counter()
            [rollout] = await env.run_group(row, client, "fake-model", {}, 1)
            per_repo_s.setdefault(task.repo, []).append(time.perf_counter() - start)
            rewards.append(rollout.reward)
    all_s = [s for values in per_repo_s.values() for s in values]
    return {
        "rollouts": len(all_s),
        "gold_reward_mean": sum(rewards) / len(rewards),
        "s_per_graded_rollout": round(statistics.mean(all_s), 2),
        "s_per_graded_rollout_by_repo": {
            repo: round(statistics.mean(values), 2) for repo, values in per_repo_s.items()
        },
    }


async def tool_overhead(calls: int) -> dict[str, object]:
    task = load_tasks(SHIPPED)[0]
    bash_ms, view_ms, bare_ms = [], [], []
    async with RepoSession(task) as session:
        for _ in range(calls):
            start = time.perf_counter()
            await session.bash("true")
            bash_ms.append(1000 * (time.perf_counter() - start))
            start = time.perf_counter()
            session.view(task.metadata["file"], 1, 40)
            view_ms.append(1000 * (time.perf_counter() - start))
            start = time.perf_counter()
            await sandbox.run("true", language="bash")
            bare_ms.append(1000 * (time.perf_counter() - start))
    return {
        "bash_ms_p50": round(pct(bash_ms, 0.5), 1),
        "bash_ms_p95": round(pct(bash_ms, 0.95), 1),
        "bare_sandbox_ms_p50": round(pct(bare_ms, 0.5), 1),
        "bash_vs_bare_sandbox_p50": round(pct(bash_ms, 0.5) / pct(bare_ms, 0.5), 2),
        "view_ms_p50": round(pct(view_ms, 0.5), 2),
        "view_ms_p95": round(pct(view_ms, 0.95), 2),
    }


async def main(args: argparse.Namespace) -> None:
    result: dict[str, object] = {"bench": "swe"}
    result.update(await graded_rollouts(args.tasks))
    result.update(await tool_overhead(args.calls))
    _, stats = await make(
        args.factory_repo, args.factory_count, seed=123, jobs=2, timeout=60, max_fail_fraction=0.25
    )
    result["factory"] = stats
    print(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=3, help="gold rollouts per repository")
    parser.add_argument("--calls", type=int, default=40, help="tool calls timed")
    parser.add_argument("--factory-repo", default="toolz")
    parser.add_argument("--factory-count", type=int, default=6)
    asyncio.run(main(parser.parse_args()))
