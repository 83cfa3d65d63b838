"""deep-research: answer multi-hop questions by searching and reading a local encyclopedia.

The model gets `search`, `open`, `find` and `answer` tools (see `tools.py`) over a BM25 index
(`corpus.py`); the rollout ends when it calls `answer` (or replies without a tool call: that
reply is its answer), or at the turn / token limit. Reward = `em_weight` * normalised exact match
(upgraded by the optional LLM judge when it fails) + `f1_weight` * token F1. Metrics: tool calls
by kind, tool errors, searches before the first supporting article was opened, supporting-article
recall, answered.

Data: by default a generated world (`world.py`): the eval split is shipped frozen in `data/eval/`
(seed 0, scale 1.0: 2,482 articles, 500 questions), the train split is generated at load; other
seeds or scales generate both. `dataset` may instead name a HotpotQA-, MuSiQue- or world-format
question source, with an optional corpus file (`qa.py`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from datasets import Dataset

from deep_research.corpus import Corpus, Document, read_documents
from deep_research.exploits import RESEARCH_EXPLOITS
from deep_research.qa import load_questions, read_records, world_rows
from deep_research.scoring import (
    accepted_answers,
    exact_match,
    judge_agrees,
    question_candidates,
    token_f1,
)
from deep_research.tools import CORPUS, TOOLS
from deep_research.world import generate_questions, generate_world
from rlkit.envs import Rubric, ThinkParser
from rlkit.envs.environment import Messages
from rlkit.envs.judge import Judge, judge_from_args
from rlkit.envs.tools import ToolCall, ToolEnv, parse_tool_calls

DATA_DIR = Path(__file__).parent / "data"
SHIPPED_WORLD = {"seed": 0, "scale": 1.0}
TOOL_NAMES = ("search", "open", "find", "answer")
SYSTEM_PROMPT = (
    "Answer the question by researching a local encyclopedia with the tools. "
    "search(query) lists matching articles with their ids; open(doc_id) shows an article's "
    "numbered lines; find(doc_id, pattern) shows only the lines that contain a phrase. "
    "Questions may need several steps: find the first entity, read its article to learn the "
    "next one, and so on. When you know the answer, call answer(text) with the answer alone "
    "(a name, a year or a place), not a sentence."
)


def answer_call_text(message: dict[str, Any]) -> str | None:
    """The `text` of the message's last well-formed `answer` call, if any."""
    for call in reversed(parse_tool_calls(message)):
        text = call.arguments.get("text")
        if call.name == "answer" and call.error is None and isinstance(text, str):
            return text
    return None


def submitted_answer(completion: Messages) -> str | None:
    """What the model's last message submits: an `answer` call's text, or its plain reply when
    it calls no tool (after `<think>`); None while it is still calling other tools."""
    last = next((m for m in reversed(completion) if m.get("role") == "assistant"), None)
    if last is None:
        return None
    text = answer_call_text(last)
    if text is None and not parse_tool_calls(last):
        return ThinkParser().parse(last.get("content") or "") or ""
    return text


def _new_stats() -> dict[str, Any]:
    return {"calls": Counter(), "errors": 0, "searches": 0, "first_support": None, "read": set()}


def track(state: dict[str, Any], calls: list[ToolCall], replies: Messages) -> None:
    """Update the rollout's tool statistics (read by the metric functions) after one turn."""
    stats = state.setdefault("research", _new_stats())
    support = set(state["info"].get("supporting_ids") or [])
    for call, reply in zip(calls, replies, strict=True):
        if call.name in TOOL_NAMES:
            stats["calls"][call.name] += 1
        if reply["content"].startswith("Error:"):
            stats["errors"] += 1
            continue
        if call.name == "search":
            stats["searches"] += 1
        elif call.name in ("open", "find"):
            doc_id = call.arguments.get("doc_id")
            stats["read"].add(doc_id)
            if doc_id in support and stats["first_support"] is None:
                stats["first_support"] = stats["searches"]


class DeepResearchEnv(ToolEnv):
    """Tool use over one corpus per row (`info["corpus"]` names it in `corpora`)."""

    def __init__(self, corpora: dict[str, Corpus], *args: Any, **kwargs: Any) -> None:
        super().__init__(TOOLS, *args, **kwargs)
        self.corpora = corpora

    def corpus_for(self, info: dict[str, Any]) -> Corpus:
        return self.corpora[info.get("corpus") or "main"]

    async def is_completed(self, messages: Messages, state: dict[str, Any]) -> bool:
        return submitted_answer(messages[-1:]) is not None

    async def env_response(self, messages: Messages, state: dict[str, Any]) -> Messages:
        token = CORPUS.set(self.corpus_for(state["info"]))
        try:
            replies = await super().env_response(messages, state)
        finally:
            CORPUS.reset(token)
        track(state, parse_tool_calls(messages[-1]), replies)
        return replies

    def gold_completion(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Search each supporting article by its title and open it, then answer the gold."""
        info = dict(row.get("info") or {})
        corpus = self.corpus_for(info)
        turns = []
        for i, doc_id in enumerate(info.get("supporting_ids") or []):
            title = corpus.document(doc_id).title
            calls = [
                _call(f"call_{i}_search", "search", {"query": title, "k": 10}),
                _call(f"call_{i}_open", "open", {"doc_id": doc_id}),
            ]
            turns.append({"role": "assistant", "content": "", "tool_calls": calls})
        final = [_call("call_answer", "answer", {"text": str(row["answer"])})]
        return [*turns, {"role": "assistant", "content": "", "tool_calls": final}]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def question_text(prompt: Messages) -> str:
    """The question as the model saw it (the last user message)."""
    for message in reversed(prompt):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def make_rubric(em_weight: float, f1_weight: float, judge: Judge | None) -> Rubric:
    def accepted(response: str, prompt: Messages, answer: str, info: dict[str, Any]) -> list[str]:
        """The accepted answers `response` is scored against; none when it lists candidates
        (`scoring.accepted_answers`)."""
        candidates = question_candidates(question_text(prompt), info.get("options"))
        return accepted_answers(response, [answer, *(info.get("aliases") or [])], candidates)

    async def correct_answer(
        prompt: Messages, completion: Messages, answer: str, info: dict[str, Any]
    ) -> float:
        """Normalised exact match; with a judge, a failed match is re-checked by the judge.
        An answer naming other candidates of the question (a list) scores 0, judge or not."""
        response = submitted_answer(completion) or ""
        answers = accepted(response, prompt, answer, info)
        if not answers:
            return 0.0
        if exact_match(response, answers):
            return 1.0
        if judge is None or not response.strip():
            return 0.0
        return float(await judge_agrees(judge, question_text(prompt), answer, response))

    def answer_f1(
        prompt: Messages, completion: Messages, answer: str, info: dict[str, Any]
    ) -> float:
        """Token F1, best over the accepted answers; 0 for a list of candidates."""
        response = submitted_answer(completion) or ""
        return token_f1(response, accepted(response, prompt, answer, info))

    def stats(state: dict[str, Any]) -> dict[str, Any]:
        return state.get("research") or _new_stats()

    def counter(kind: str) -> Any:
        def count(state: dict[str, Any]) -> float:
            return float(stats(state)["calls"][kind])

        count.__name__ = f"{kind}_calls"
        return count

    def answered(completion: Messages) -> float:
        """1 when the model called `answer` well-formed (a plain final reply is scored as its
        answer too, but does not count here)."""
        replies = [m for m in completion if m.get("role") == "assistant"]
        return float(any(answer_call_text(m) is not None for m in replies))

    def tool_errors(state: dict[str, Any]) -> float:
        return float(stats(state)["errors"])

    def searches_before_support(state: dict[str, Any]) -> float:
        """Searches made before the first supporting article was opened (-1: never opened)."""
        first = stats(state)["first_support"]
        return -1.0 if first is None else float(first)

    def support_recall(state: dict[str, Any], info: dict[str, Any]) -> float:
        support = set(info.get("supporting_ids") or [])
        return len(support & stats(state)["read"]) / len(support) if support else 0.0

    metrics = [counter(k) for k in ("search", "open", "find")]
    metrics += [answered, tool_errors, searches_before_support, support_recall]
    return Rubric(
        [correct_answer, answer_f1, *metrics], [em_weight, f1_weight] + [0.0] * len(metrics)
    )


def _world_split(
    split: str, seed: int, scale: float, n: int
) -> tuple[list[dict[str, Any]], list[Document]]:
    if split == "eval" and {"seed": seed, "scale": scale} == SHIPPED_WORLD:
        docs = read_documents(DATA_DIR / "eval" / "corpus.jsonl")
        questions = read_records(str(DATA_DIR / "eval" / "questions.jsonl"))
        questions = questions[:n] if n > 0 else questions
    else:
        world = generate_world(seed, split, scale)
        docs = world.articles()
        questions = generate_questions(world, n if n > 0 else 500)
    rows = world_rows(questions)
    for row in rows:
        row["info"]["corpus"] = split
    return rows, docs


def load_environment(
    dataset: str = "world",
    format: str = "auto",
    corpus: str | None = None,
    dataset_split: str = "train",
    num_train_examples: int = 2000,
    num_eval_examples: int = -1,
    world_seed: int = 0,
    world_scale: float = 1.0,
    max_turns: int = 10,
    em_weight: float = 0.5,
    f1_weight: float = 0.5,
    system_prompt: str = SYSTEM_PROMPT,
    judge_base_url: str | None = None,
    judge_model: str | None = None,
    judge_api_key_var: str | None = None,
) -> DeepResearchEnv:
    """The generated world (train + eval splits) or a question source (training set only)."""
    judge = judge_from_args(judge_base_url, judge_model, judge_api_key_var)
    if dataset == "world":
        train_rows, train_docs = _world_split("train", world_seed, world_scale, num_train_examples)
        eval_rows, eval_docs = _world_split("eval", world_seed, world_scale, num_eval_examples)
        corpora = {"train": Corpus.cached(train_docs), "eval": Corpus.cached(eval_docs)}
        train, evaluation = Dataset.from_list(train_rows), Dataset.from_list(eval_rows)
    else:
        rows, docs = load_questions(dataset, format, corpus, dataset_split, num_train_examples)
        corpora = {"main": Corpus.cached(docs)}
        train, evaluation = Dataset.from_list(rows), None
    env = DeepResearchEnv(
        corpora,
        dataset=train,
        eval_dataset=evaluation,
        system_prompt=system_prompt,
        rubric=make_rubric(em_weight, f1_weight, judge),
        sampling_defaults={"temperature": 1.0, "max_tokens": 1024},
        env_id="deep-research",
        max_turns=max_turns,
    )
    env.exploits.extend(RESEARCH_EXPLOITS)
    return env
