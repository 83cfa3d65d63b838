"""deep-research rollouts with scripted models behind the fake OpenAI server: the tools really
run against the shipped world's index, and the rubric scores what the model submitted."""

from __future__ import annotations

import asyncio
from typing import Any

from deep_research import DeepResearchEnv
from research_agents import call, scripted

from rlkit.envs import Rollout, load_environment
from rlkit.inference import InferenceClient
from tests.helpers.cli import run_cli
from tests.helpers.fake_openai import FakeOpenAIServer, replay


async def run(env: DeepResearchEnv, row: dict[str, Any], responder: Any) -> Rollout:
    with FakeOpenAIServer(responder=responder) as server:
        async with InferenceClient(server.url) as client:
            [rollout] = await env.run_group(row, client, "fake-model", {}, n=1)
    assert rollout.error is None, rollout.error
    return rollout


def row_where(env: DeepResearchEnv, test: Any) -> dict[str, Any]:
    return next(r for r in env.get_eval_dataset() if test(r))


def tool_replies(rollout: Rollout) -> list[str]:
    return [m["content"] for m in rollout.completion if m["role"] == "tool"]


async def test_agent_that_searches_reads_and_answers_scores_one(world_env) -> None:
    row = row_where(world_env, lambda r: r["info"]["hops"] == 3)
    first, second, third = row["info"]["supporting_ids"]
    titles = [world_env.corpus_for(row["info"]).document(i).title for i in (first, second, third)]
    turns = [
        call("search", query=titles[0]),
        call("open", doc_id=first),
        call("search", query=titles[1], k=3),
        call("find", doc_id=second, pattern=titles[2].split(" (")[0]),
        call("search", query=titles[2]),
        call("open", doc_id=third, offset=0, length=10),
        call("answer", text=row["answer"]),
    ]
    rollout = await run(world_env, row, scripted(turns))
    assert rollout.reward == 1.0
    assert len(rollout.turns) == 7 and rollout.finish_reason == "tool_calls"
    replies = tool_replies(rollout)
    assert f"[{first}]" in replies[0]  # the search listed the article the agent then opened
    assert replies[1].startswith(f"# {titles[0]} [{first}]")
    assert not any(r.startswith("Error:") for r in replies)
    m = rollout.metrics
    assert (m["search_calls"], m["open_calls"], m["find_calls"]) == (3.0, 2.0, 1.0)
    assert m["answered"] == m["support_recall"] == m["correct_answer"] == m["answer_f1"] == 1.0
    assert m["searches_before_support"] == 1.0 and m["tool_errors"] == 0.0


async def test_gold_completions_score_one(world_env) -> None:
    rows = [world_env.get_eval_dataset()[i] for i in range(0, 500, 25)]
    gold = {row["prompt"][-1]["content"]: world_env.gold_completion(row) for row in rows}
    with FakeOpenAIServer(responder=replay(gold)) as server:
        async with InferenceClient(server.url) as client:
            groups = await asyncio.gather(
                *(world_env.run_group(row, client, "fake-model", {}, n=1) for row in rows)
            )
    for [rollout] in groups:
        assert rollout.error is None and rollout.reward == 1.0
        assert rollout.metrics["support_recall"] == 1.0
        assert len(rollout.turns) == rollout.info["hops"] + 1


async def test_answering_without_searching(world_env) -> None:
    row = row_where(world_env, lambda r: len(r["answer"].split()) == 2)  # a person's name
    wrong = await run(world_env, row, scripted([call("answer", text="Nobody Known")]))
    assert wrong.reward == 0.0
    m = wrong.metrics
    assert m["search_calls"] == 0 and m["answered"] == 1.0
    assert m["searches_before_support"] == -1.0 and m["support_recall"] == 0.0
    # half the name right: F1 = 0.5, exact match 0 -> 0.5 * 0 + 0.5 * 0.5
    guess = f"{row['answer'].split()[0]} Unknown"
    partial = await run(world_env, row, scripted([call("answer", text=guess)]))
    assert partial.reward == 0.25 and partial.metrics["answer_f1"] == 0.5
    # a plain reply (no tool call) is the answer too; normalisation ignores case and "the"
    reply = {"content": f"<think>hm</think>the {row['answer'].upper()}."}
    lucky = await run(world_env, row, scripted([reply]))
    assert lucky.reward == 1.0 and lucky.metrics["answered"] == 0.0


async def test_malformed_calls_and_unknown_ids_become_tool_errors(world_env) -> None:
    row = world_env.get_eval_dataset()[0]
    bad_json = {"id": "x", "type": "function", "function": {"name": "search", "arguments": "{oops"}}
    turns = [
        {"content": "", "tool_calls": [bad_json]},
        call("browse", url="http://example.org"),
        call("open", doc_id="no-such-article"),
        call("open", doc_id=row["info"]["supporting_ids"][0], offset=999),
        call("search", query="x", k=0),
        call("search"),
        call("find", doc_id=row["info"]["supporting_ids"][0], pattern="  "),
        call("find", doc_id="missing", pattern="born"),
        call("answer", answer="wrong field name"),
        {"content": '<tool_call>{"name": "open", "arguments": [1, 2]}</tool_call>'},
        call("answer", text=row["answer"]),
    ]
    env = load_environment("deep-research", num_train_examples=2, max_turns=20)
    rollout = await run(env, row, scripted(turns))
    replies = tool_replies(rollout)
    expected = [
        "malformed arguments",
        "unknown tool 'browse'",
        "no document with id 'no-such-article'",
        "offset 999 is outside",
        "k must be between 1 and 20",
        "invalid arguments for search: query: Missing required argument",
        "pattern is empty",
        "no document with id 'missing'",
        "invalid arguments for answer",
        "arguments must be a JSON object",
    ]
    assert len(replies) == len(expected)
    for reply, needle in zip(replies, expected, strict=True):
        assert reply.startswith("Error:") and needle in reply, reply
    assert rollout.metrics["tool_errors"] == len(expected)
    assert rollout.reward == 1.0  # the model recovered and answered


async def test_turn_limit_ends_a_rollout_without_an_answer(world_env) -> None:
    row = world_env.get_eval_dataset()[1]
    env = load_environment("deep-research", num_train_examples=2, max_turns=3)
    rollout = await run(env, row, scripted([call("search", query="anything")]))
    assert len(rollout.turns) == 3 and rollout.reward == 0.0
    assert rollout.metrics["answered"] == 0.0 and rollout.metrics["search_calls"] == 2.0


async def test_llm_judge_rescues_free_form_answers(world_env) -> None:
    row = row_where(world_env, lambda r: r["answer"].isdigit())
    free_form = call("answer", text=f"I believe it was around the year {row['answer']}")
    verdicts: list[str] = []

    def judge(body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        verdicts.append(prompt)
        return "<think>same year</think>yes" if row["answer"] in prompt else "no"

    with FakeOpenAIServer(responder=judge) as judge_server:
        env = load_environment(
            "deep-research", num_train_examples=2,
            judge_base_url=judge_server.url, judge_model="fake-model",
        )  # fmt: skip
        rollout = await run(env, row, scripted([free_form]))
        assert rollout.metrics["correct_answer"] == 1.0
        assert 0.5 < rollout.reward < 1.0  # 0.5 for the judged match + 0.5 * token F1
        exact = await run(env, row, scripted([call("answer", text=row["answer"])]))
    assert exact.reward == 1.0
    assert len(verdicts) == 1  # the judge is asked only when exact match fails
    assert free_form["tool_calls"][0]["function"]["arguments"].split('"')[3] in verdicts[0]


def test_rlkit_env_check_gold(monkeypatch, capsys) -> None:
    code, output = run_cli(
        monkeypatch, capsys, "env", "check", "deep-research", "--gold", "-n", "60"
    )
    assert code == 0, output
    for kind in ("gold", "empty", "garbage"):
        assert f"{kind}: 60/60 as expected" in output
