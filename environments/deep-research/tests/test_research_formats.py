"""HotpotQA-, MuSiQue- and world-format question files (hand-written fixtures in the published
layouts), with the corpus built from their context paragraphs or read from a corpus file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deep_research.qa import load_questions

from rlkit.envs import load_environment
from rlkit.errors import UsageError
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer, replay

FIXTURES = Path(__file__).parent / "fixtures"
HOTPOT = FIXTURES / "hotpot_dev_distractor.json"
MUSIQUE = FIXTURES / "musique_ans_dev.jsonl"


def test_hotpotqa_rows_and_corpus_from_context() -> None:
    rows, docs = load_questions(str(HOTPOT))
    assert [r["answer"] for r in rows] == ["yes", "Chief of Protocol"]
    assert rows[1]["info"]["supporting_ids"] == ["kiss-and-tell-1945-film", "shirley-temple"]
    assert rows[0]["info"]["type"] == "comparison" and rows[0]["info"]["hops"] == 2
    by_id = {d.id: d for d in docs}
    assert len(docs) == 8  # "Ed Wood" appears in both questions' contexts: indexed once
    assert by_id["shirley-temple"].lines[1].startswith("As an adult")  # line = sentence id


def test_hotpotqa_hub_layout_and_dataset_folders(tmp_path: Path) -> None:
    hub = []
    for record in json.loads(HOTPOT.read_text()):
        titles, sentences = zip(*record["context"], strict=True)
        fact_titles, sent_ids = zip(*record["supporting_facts"], strict=True)
        hub.append({
            **record,
            "context": {"title": list(titles), "sentences": list(sentences)},
            "supporting_facts": {"title": list(fact_titles), "sent_id": list(sent_ids)},
        })  # fmt: skip
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "validation.jsonl").write_text("\n".join(json.dumps(r) for r in hub))
    expected = load_questions(str(HOTPOT))
    assert load_questions(str(tmp_path / "hub" / "validation.jsonl"), "hotpotqa") == expected
    # a dataset folder goes through `datasets` (as a hub name would), split by file name
    assert load_questions(str(tmp_path / "hub"), split="validation") == expected


def test_musique_rows_skip_unanswerable_and_keep_aliases() -> None:
    rows, docs = load_questions(str(MUSIQUE), "musique")
    assert len(rows) == 2
    assert rows[0]["info"]["supporting_ids"] == ["lake-ontario", "niagara-falls"]
    assert rows[0]["info"]["aliases"] == ["the Niagara Falls", "Niagara"]
    assert rows[0]["info"]["type"] == "2hop"
    assert sorted(d.id for d in docs) == [
        "boston-harbor", "great-lakes", "lake-erie", "lake-ontario", "niagara-falls",
    ]  # fmt: skip


def test_questions_with_a_separate_corpus_file(tmp_path: Path) -> None:
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"id": f"w{i}", "title": t, "text": f"{t} is an article."})
            for i, t in enumerate(["Lake Ontario", "Niagara Falls", "Lake Erie", "Great Lakes"])
        )
    )
    rows, docs = load_questions(str(MUSIQUE), corpus_path=str(corpus))
    assert [d.id for d in docs] == ["w0", "w1", "w2", "w3"]
    assert rows[0]["info"]["supporting_ids"] == ["w0", "w1"]
    corpus.write_text(json.dumps({"id": "w0", "title": "Lake Ontario", "text": "x"}))
    with pytest.raises(UsageError, match="'Niagara Falls' is not in the corpus"):
        load_questions(str(MUSIQUE), corpus_path=str(corpus))


def test_bad_sources_are_usage_errors(tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"q": "?", "a": "!"}))
    with pytest.raises(UsageError, match="cannot tell the question format"):
        load_questions(str(odd))
    with pytest.raises(UsageError, match="not valid musique data"):
        load_questions(str(HOTPOT), "musique")
    with pytest.raises(UsageError, match="need a corpus file"):
        load_questions(str(odd), "world")
    with pytest.raises(UsageError, match="format must be one of"):
        load_questions(str(HOTPOT), "squad")


@pytest.mark.parametrize("source", [HOTPOT, MUSIQUE])
async def test_gold_rollouts_on_loaded_questions(source: Path) -> None:
    env = load_environment("deep-research", dataset=str(source))
    assert env.eval_dataset is None and len(env.get_dataset()) == 2
    rows = list(env.get_dataset())
    gold = {row["prompt"][-1]["content"]: env.gold_completion(row) for row in rows}
    with FakeOpenAIServer(responder=replay(gold)) as server:
        async with InferenceClient(server.url) as client:
            for row in rows:
                [rollout] = await env.run_group(row, client, "fake-model", {}, n=1)
                assert rollout.error is None and rollout.reward == 1.0
                assert rollout.metrics["support_recall"] == 1.0
