"""deep-research search backend: index build time and queries/s for the shipped corpus (the eval
world, 2,482 articles) and a ~100k-article generated world, and tool latency inside rollouts.

Build = bm25s tokenisation + indexing (`Corpus.build`, no cache); queries are the entity names of
the world's questions' supporting articles (k=10, one at a time, as the `search` tool runs them).
Tool latency: gold rollouts (search + open per supporting article, then answer) through the
environment's own `rollout` against the fake OpenAI server, timing every `call_tool` (argument
validation, the tool, result formatting) on each corpus. Prints one JSON line; `ratio` is the
100k corpus's queries/s over the shipped corpus's.

    .venv/bin/python tests/benchmarks/bench_deep_research.py [--scale 40.3] [--rollouts 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

from datasets import Dataset
from deep_research import DATA_DIR, DeepResearchEnv, make_rubric
from deep_research.corpus import Corpus, Document, read_documents
from deep_research.qa import read_records, world_rows
from deep_research.world import generate_questions, generate_world

from rlkit.envs.tools import ToolCall
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer, replay


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def search_figures(docs: list[Document], queries: list[str]) -> tuple[Corpus, dict[str, Any]]:
    start = time.perf_counter()
    corpus = Corpus.build(docs, progress=False)
    build_s = time.perf_counter() - start
    corpus.search(queries[0], 10)  # warm-up
    start = time.perf_counter()
    for query in queries:
        corpus.search(query, 10)
    elapsed = time.perf_counter() - start
    figures = {
        "documents": len(docs),
        "build_s": round(build_s, 2),
        "queries": len(queries),
        "queries_per_s": round(len(queries) / elapsed, 1),
    }
    return corpus, figures


async def tool_latency(env: DeepResearchEnv, rows: list[dict[str, Any]]) -> dict[str, float]:
    """p50 / p95 (ms) of every tool call made by gold rollouts of `rows`."""
    timings: list[float] = []
    call_tool = env.call_tool

    async def timed(call: ToolCall) -> str:
        start = time.perf_counter()
        result = await call_tool(call)
        timings.append((time.perf_counter() - start) * 1000)
        return result

    env.call_tool = timed  # type: ignore[method-assign]
    gold = {row["prompt"][-1]["content"]: env.gold_completion(row) for row in rows}
    with FakeOpenAIServer(responder=replay(gold)) as server:
        async with InferenceClient(server.url) as client:
            for row in rows:  # one at a time: latency, not throughput
                [rollout] = await env.run_group(row, client, "fake-model", {}, n=1)
                assert rollout.reward == 1.0, rollout.error
    return {
        "tool_calls": len(timings),
        "p50_ms": round(percentile(timings, 50), 2),
        "p95_ms": round(percentile(timings, 95), 2),
    }


def environment_for(corpus: Corpus, questions: list[dict[str, Any]]) -> DeepResearchEnv:
    """The deep-research environment over an indexed corpus and world-format questions."""
    return DeepResearchEnv(
        {"main": corpus},
        dataset=Dataset.from_list(world_rows(questions)),
        rubric=make_rubric(em_weight=0.5, f1_weight=0.5, judge=None),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=40.3, help="world scale (~100k articles)")
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--rollouts", type=int, default=100)
    args = parser.parse_args()
    os.environ["RLKIT_HOME"] = tempfile.mkdtemp(prefix="bench-rlkit-home-")

    shipped_docs = read_documents(DATA_DIR / "eval" / "corpus.jsonl")
    shipped_questions = read_records(str(DATA_DIR / "eval" / "questions.jsonl"))
    queries = entity_queries(shipped_docs, shipped_questions, args.queries)
    shipped_corpus, shipped = search_figures(shipped_docs, queries)

    start = time.perf_counter()
    world = generate_world(seed=0, split="train", scale=args.scale)
    big_docs = world.articles()
    big_questions = generate_questions(world, args.rollouts)
    generate_s = time.perf_counter() - start
    queries = entity_queries(big_docs, big_questions, args.queries)
    big_corpus, big = search_figures(big_docs, queries)
    big["generate_s"] = round(generate_s, 2)

    for corpus, questions, figures in (
        (shipped_corpus, shipped_questions[: args.rollouts], shipped),
        (big_corpus, big_questions, big),
    ):
        env = environment_for(corpus, questions)
        figures["tool_latency"] = asyncio.run(tool_latency(env, list(env.get_dataset())))
    result = {
        "benchmark": "deep_research",
        "shipped": shipped,
        "generated_100k": big,
        "ratio": round(big["queries_per_s"] / shipped["queries_per_s"], 3),
    }
    print(json.dumps(result))


def entity_queries(docs: list[Document], questions: list[dict[str, Any]], n: int) -> list[str]:
    titles = {doc.id: doc.title for doc in docs}
    names = [titles[i].split(" (")[0] for q in questions for i in q["supporting_ids"]]
    return (names * (n // max(1, len(names)) + 1))[:n]


if __name__ == "__main__":
    main()
