"""The generated world: deterministic, shipped eval split up to date, disjoint splits, valid
questions (answers stated in their supporting articles, 1 to 4 hops, distractors present)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from deep_research import DATA_DIR
from deep_research.world import generate_questions, generate_world, write_world


def test_generation_is_deterministic_and_the_shipped_eval_split_is_current(tmp_path: Path) -> None:
    write_world(tmp_path, seed=0, split="eval", scale=1.0, num_questions=500)
    for name in ("corpus.jsonl", "questions.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / "eval" / name).read_bytes(), (
            f"{name} differs: regenerate with `python -m deep_research --split eval "
            f"--out environments/deep-research/deep_research/data/eval`"
        )
    shipped = sum(p.stat().st_size for p in (DATA_DIR / "eval").iterdir())
    assert shipped < 3_000_000


def test_train_and_eval_worlds_are_disjoint() -> None:
    train, evaluation = generate_world(0, "train"), generate_world(0, "eval")
    assert not {e.name for e in train.entities} & {e.name for e in evaluation.entities}
    assert not {d.id for d in train.articles()} & {d.id for d in evaluation.articles()}
    other_seed = generate_world(1, "train")
    assert [e.name for e in other_seed.entities] != [e.name for e in train.entities]


def test_questions_are_answerable_from_their_supporting_articles() -> None:
    world = generate_world(3, "train", scale=0.5)
    docs = {d.id: d for d in world.articles()}
    questions = generate_questions(world, 400)
    assert len({q["question"] for q in questions}) == 400
    assert Counter(q["hops"] for q in questions).keys() == {1, 2, 3, 4}
    assert {q["type"] for q in questions} == {"bridge", "comparison"}
    for q in questions:
        support = [docs[i] for i in q["supporting_ids"]]
        assert len(support) == q["hops"] == len(set(q["supporting_ids"]))
        if q["type"] == "bridge":  # the last article states the answer
            assert q["answer"] in support[-1].text, q
        else:
            assert q["answer"] in {d.title.split(" (")[0] for d in support}
        # each article after the first is named in the previous one (a real chain)
        for previous, doc in zip(support, support[1:], strict=False):
            if q["type"] == "bridge":
                assert doc.title.split(" (")[0] in previous.text, (q, previous.text)


def test_distractors_share_names_and_facts() -> None:
    world = generate_world(0, "eval")
    docs = world.articles()
    namesakes = [d.title for d in docs if d.title.endswith(")")]
    assert len(namesakes) >= 20  # people who share a full name carry their occupation
    questions = generate_questions(world, 200)
    # the named entity of most questions is also mentioned in other articles (backlinks,
    # settings, residences), so searching its name returns distractors too
    confusable = 0
    for q in questions:
        name = next(d for d in docs if d.id == q["supporting_ids"][0]).title.split(" (")[0]
        others = [d for d in docs if name in d.text and d.id not in q["supporting_ids"]]
        confusable += bool(others)
    assert confusable / len(questions) > 0.8


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="split must be one of"):
        generate_world(0, "test")
    with pytest.raises(ValueError, match="scale must be > 0"):
        generate_world(0, "train", scale=0)
