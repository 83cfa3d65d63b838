"""Question files in three formats, normalised to one row shape plus the corpus they search.

- `world`: this package's format (`python -m deep_research.world` writes it): questions JSONL
  with `id, question, answer, supporting_ids, hops, type` (optional `aliases`), and a corpus
  JSONL file (`id, title, text, url?`) that is required.
- `hotpotqa`: HotpotQA's `_id, question, answer, type, level, supporting_facts, context`, with
  `context` either as the original `[[title, [sentence, ...]], ...]` or the hub layout
  `{"title": [...], "sentences": [[...]]}` (same for `supporting_facts`).
- `musique`: MuSiQue's `id, question, answer, answer_aliases, paragraphs` (`idx, title,
  paragraph_text, is_supporting`); unanswerable rows (`answerable: false`) are skipped.

Without a corpus file, the corpus is every distinct context paragraph of the loaded questions
(HotpotQA's distractor setting: one sentence per line, so line numbers are sentence ids). With
one, supporting titles are looked up in it. Sources are local `.json`/`.jsonl` paths or anything
`rlkit.envs.data.load_dataset_any` accepts (a hub name, a dataset folder).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from deep_research.corpus import Document, read_documents
from deep_research.world import slug
from rlkit.envs.data import load_dataset_any
from rlkit.errors import UsageError

FORMATS = ("auto", "world", "hotpotqa", "musique")


def read_records(source: str, split: str = "train") -> list[dict[str, Any]]:
    """Raw question records from a local JSON array / JSONL file, or via `datasets`."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() in (".json", ".jsonl"):
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            return list(json.loads(text))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return list(load_dataset_any(source, split=split))


def detect_format(record: dict[str, Any]) -> str:
    if "paragraphs" in record:
        return "musique"
    if "context" in record and "supporting_facts" in record:
        return "hotpotqa"
    if "supporting_ids" in record:
        return "world"
    raise UsageError(f"cannot tell the question format from the fields {sorted(record)}")


def _pairs(value: Any, first: str, second: str) -> list[tuple[Any, Any]]:
    """HotpotQA's [[a, b], ...] or the hub's {first: [...], second: [...]} as pairs."""
    if isinstance(value, dict):
        return list(zip(value[first], value[second], strict=True))
    return [(item[0], item[1]) for item in value]


class CorpusBuilder:
    """Collects context paragraphs as documents with unique ids (title slug, numbered on
    collision) and remembers which id each (title, text) got."""

    def __init__(self) -> None:
        self.docs: list[Document] = []
        self.ids: dict[tuple[str, str], str] = {}
        self.taken: set[str] = set()

    def add(self, title: str, text: str) -> str:
        key = (title, text)
        if key not in self.ids:
            base = slug(title) or "doc"
            doc_id, n = base, 1
            while doc_id in self.taken:
                n += 1
                doc_id = f"{base}-{n}"
            self.taken.add(doc_id)
            self.ids[key] = doc_id
            self.docs.append(Document(doc_id, title, text))
        return self.ids[key]


def _options(record: dict[str, Any], titles: list[str], kind: str) -> list[str]:
    """A question's explicit options (what a listing answer would name): the world format's
    `options`, else for a comparison the compared entities (its supporting titles, without a
    namesake's "(occupation)"); "yes" and "no" for a yes/no question."""
    options = [str(o) for o in record.get("options") or []]
    if not options and kind == "comparison":
        options = [re.sub(r" \([^)]*\)$", "", str(t)) for t in titles]
    if str(record.get("answer", "")).strip().lower() in ("yes", "no"):
        options += ["yes", "no"]
    return options


def _row(question: str, answer: str, support: list[str], aliases: list[str], **info: Any) -> dict:
    return {
        "question": question,
        "answer": answer,
        "info": {"supporting_ids": support, "aliases": aliases, "hops": len(support), **info},
    }


def _hotpot_rows(records: list[dict], builder: CorpusBuilder) -> list[dict]:
    rows = []
    for record in records:
        by_title = {}
        for title, sentences in _pairs(record["context"], "title", "sentences"):
            text = "\n".join(s.strip() for s in sentences)
            by_title[title] = builder.add(title, text)
        facts = _pairs(record["supporting_facts"], "title", "sent_id")
        titles = list(dict.fromkeys(title for title, _ in facts))
        rows.append(
            _row(
                record["question"], str(record["answer"]), [by_title.get(t, t) for t in titles], [],
                supporting_titles=titles, type=str(record.get("type") or ""),
                id=str(record.get("_id") or record.get("id") or ""),
                options=_options(record, titles, str(record.get("type") or "")),
            )
        )  # fmt: skip
    return rows


def _musique_rows(records: list[dict], builder: CorpusBuilder) -> list[dict]:
    rows = []
    for record in records:
        if record.get("answerable") is False:
            continue
        support, titles = [], []
        for paragraph in record["paragraphs"]:
            doc_id = builder.add(paragraph["title"], paragraph["paragraph_text"].strip())
            if paragraph.get("is_supporting"):
                support.append(doc_id)
                titles.append(paragraph["title"])
        hops = str(record.get("id", "")).split("hop")[0]
        rows.append(
            _row(
                record["question"], str(record["answer"]), support,
                [str(a) for a in record.get("answer_aliases") or []],
                supporting_titles=titles, type=f"{hops}hop" if hops.isdigit() else "",
                id=str(record.get("id") or ""), options=_options(record, titles, ""),
            )
        )  # fmt: skip
    return rows


def world_rows(records: list[dict]) -> list[dict]:
    """Rows of questions in the world format (what `world.generate_questions` returns)."""
    return [
        _row(
            r["question"], str(r["answer"]), list(r["supporting_ids"]),
            list(r.get("aliases") or []),
            type=str(r.get("type") or ""), id=str(r.get("id") or ""),
            options=_options(r, list(r.get("supporting_titles") or []), str(r.get("type") or "")),
        )
        for r in records
    ]  # fmt: skip


def _link_to_corpus(rows: list[dict], docs: list[Document]) -> None:
    """Point supporting ids at the given corpus's documents (by id, else by title)."""
    ids = {doc.id for doc in docs}
    by_title = {doc.title: doc.id for doc in docs}
    for row in rows:
        info = row["info"]
        names = info.get("supporting_titles") or info["supporting_ids"]
        linked = []
        for doc_id, title in zip(info["supporting_ids"], names, strict=True):
            if doc_id in ids:
                linked.append(doc_id)
            elif title in by_title:
                linked.append(by_title[title])
            else:
                raise UsageError(f"question {info.get('id')!r}: {title!r} is not in the corpus")
        info["supporting_ids"] = linked


def load_questions(
    source: str,
    fmt: str = "auto",
    corpus_path: str | None = None,
    split: str = "train",
    num_examples: int = -1,
) -> tuple[list[dict[str, Any]], list[Document]]:
    """(rows with question / answer / info, the corpus documents) for a question source."""
    if fmt not in FORMATS:
        raise UsageError(f"question format must be one of {FORMATS}, got {fmt!r}")
    records = read_records(source, split)
    if not records:
        raise UsageError(f"no questions in {source!r}")
    if num_examples > 0:
        records = records[:num_examples]
    fmt = detect_format(records[0]) if fmt == "auto" else fmt
    builder = CorpusBuilder()
    try:
        if fmt == "hotpotqa":
            rows = _hotpot_rows(records, builder)
        elif fmt == "musique":
            rows = _musique_rows(records, builder)
        else:
            if corpus_path is None:
                raise UsageError("questions in the world format need a corpus file (`corpus`)")
            rows = world_rows(records)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{source!r} is not valid {fmt} data: {exc!r}") from exc
    docs = read_documents(corpus_path) if corpus_path else builder.docs
    _link_to_corpus(rows, docs)
    return rows, docs
