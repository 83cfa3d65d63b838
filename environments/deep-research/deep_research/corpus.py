"""A searchable document collection: BM25 (bm25s) over JSONL documents, plus line-based reading.

Documents are `{"id", "title", "text", "url"?}`; a document's lines are its text split on
newlines (one sentence or paragraph per line), which `open` numbers and `find` greps. The index
covers title + text. `Corpus.cached(docs)` builds an index once and keeps it under
`$RLKIT_HOME/deep-research/corpora/<content hash>/` (written atomically), so a second load of the
same documents only reads the index back.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer
from rich.progress import Progress

from rlkit.atomic import atomic_dir
from rlkit.hub.client import rlkit_home

INDEX_VERSION = "1"  # bump when tokenisation or the saved layout changes (invalidates caches)
STOPWORDS = "en"
TOKENIZE_CHUNK = 2000
SNIPPET_CHARS = 200


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    url: str = ""

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")


@dataclass(frozen=True)
class SearchHit:
    id: str
    title: str
    snippet: str
    score: float


def read_documents(path: str | Path) -> list[Document]:
    """Documents from a JSONL file (`id`, `title`, `text`, optional `url` per line)."""
    docs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            docs.append(
                Document(str(row["id"]), str(row["title"]), str(row["text"]), row.get("url") or "")
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a corpus document ({exc!r})") from exc
    return docs


def write_documents(docs: Iterable[Document], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            row: dict[str, Any] = {"id": doc.id, "title": doc.title, "text": doc.text}
            if doc.url:
                row["url"] = doc.url
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def content_hash(docs: list[Document]) -> str:
    """Identifies a corpus by its documents (order included) and the index format."""
    digest = hashlib.sha256(f"rlkit-corpus-v{INDEX_VERSION}\n".encode())
    for doc in docs:
        digest.update(json.dumps([doc.id, doc.title, doc.text, doc.url]).encode() + b"\n")
    return digest.hexdigest()[:20]


class Corpus:
    """Documents plus their BM25 index; `search`, `open` and `find` are the tools' backend."""

    def __init__(self, docs: list[Document], retriever: bm25s.BM25, tokenizer: Tokenizer) -> None:
        self.docs = docs
        self.by_id = {doc.id: doc for doc in docs}
        if len(self.by_id) != len(docs):
            raise ValueError("corpus document ids must be unique")
        self.retriever = retriever
        self.tokenizer = tokenizer
        # Queries reach bm25s as words (its Tokenized path rebuilds this reverse vocabulary on
        # every call, a cost per query that grows with the corpus).
        self.words = {i: word for word, i in tokenizer.get_vocab_dict().items()}

    # ---- building, saving, loading ---------------------------------------------------------
    @classmethod
    def build(cls, docs: list[Document], progress: bool = True) -> Corpus:
        """Tokenise (in chunks, one shared vocabulary) and index the documents."""
        if not docs:
            raise ValueError("cannot index an empty corpus")
        tokenizer = Tokenizer(stopwords=STOPWORDS)
        ids: list[list[int]] = []
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task(f"indexing {len(docs):,} documents", total=len(docs) + 1)
            for start in range(0, len(docs), TOKENIZE_CHUNK):
                chunk = docs[start : start + TOKENIZE_CHUNK]
                texts = [f"{doc.title}\n{doc.text}" for doc in chunk]
                ids += tokenizer.tokenize(
                    texts, update_vocab=True, return_as="ids", show_progress=False
                )
                bar.advance(task, len(chunk))
            retriever = bm25s.BM25()
            retriever.index(tokenizer.to_tokenized_tuple(ids), show_progress=False)
            bar.advance(task)
        return cls(docs, retriever, tokenizer)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_documents(self.docs, directory / "docs.jsonl")
        self.retriever.save(str(directory / "index"), show_progress=False)
        self.tokenizer.save_vocab(str(directory / "index"))

    @classmethod
    def load(cls, directory: str | Path) -> Corpus:
        directory = Path(directory)
        docs = read_documents(directory / "docs.jsonl")
        retriever = bm25s.BM25.load(str(directory / "index"), show_progress=False)
        tokenizer = Tokenizer(stopwords=STOPWORDS)
        tokenizer.load_vocab(str(directory / "index"))
        return cls(docs, retriever, tokenizer)

    @classmethod
    def cached(cls, docs: list[Document], cache_root: Path | None = None) -> Corpus:
        """Load the index of these documents from the cache, building and saving it once."""
        root = (cache_root or rlkit_home() / "deep-research" / "corpora") / content_hash(docs)
        if (root / "index").is_dir():
            return cls.load(root)
        corpus = cls.build(docs)
        with atomic_dir(root, durable=False) as tmp:  # rebuildable, so no fsync
            corpus.save(tmp)
        return corpus

    # ---- the tools' backend ----------------------------------------------------------------
    def document(self, doc_id: str) -> Document:
        doc = self.by_id.get(doc_id)
        if doc is None:
            raise ValueError(f"no document with id {doc_id!r}; use an id from the search results")
        return doc

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """The k best documents for a keyword query (only documents matching some word).

        Scores come from bm25s; the top k are picked among the matching documents only, which
        is faster than `BM25.retrieve`'s partition of every score on a large corpus
        (docs/benchmarks.md).
        """
        ids = self.tokenizer.tokenize(
            [query], update_vocab=False, return_as="ids", show_progress=False
        )[0]
        if not any(ids):  # only unknown words or stopwords
            return []
        scores = self.retriever.get_scores([self.words[i] for i in ids])
        hits = np.flatnonzero(scores)
        if len(hits) > k:
            hits = hits[np.argpartition(-scores[hits], k)[:k]]
        hits = hits[np.argsort(-scores[hits], kind="stable")]
        words = set(re.findall(r"\w\w+", query.lower()))
        found = []
        for index in hits:
            doc = self.docs[int(index)]
            score = round(float(scores[index]), 3)
            found.append(SearchHit(doc.id, doc.title, _snippet(doc, words), score))
        return found

    def open(self, doc_id: str, offset: int = 0, length: int = 40) -> tuple[Document, list[str]]:
        """Lines offset..offset+length-1 of a document, each prefixed with its number."""
        doc = self.document(doc_id)
        lines = doc.lines
        if offset < 0 or (lines and offset >= len(lines)):
            raise ValueError(f"offset {offset} is outside {doc_id!r} (lines 0-{len(lines) - 1})")
        chosen = lines[offset : offset + max(1, length)]
        return doc, [f"{offset + i}: {line}" for i, line in enumerate(chosen)]

    def find(self, doc_id: str, pattern: str) -> list[str]:
        """Numbered lines of a document containing `pattern` (case-insensitive, literal)."""
        if not pattern.strip():
            raise ValueError("pattern is empty")
        needle = pattern.lower()
        doc = self.document(doc_id)
        return [f"{i}: {line}" for i, line in enumerate(doc.lines) if needle in line.lower()]


def _snippet(doc: Document, words: set[str]) -> str:
    """The document line sharing the most words with the query, cut to SNIPPET_CHARS."""
    lines = [line for line in doc.lines if line.strip()] or [doc.text]
    overlap = [len(words & set(re.findall(r"\w\w+", line.lower()))) for line in lines]
    best = lines[int(np.argmax(overlap))]
    return best if len(best) <= SNIPPET_CHARS else best[: SNIPPET_CHARS - 3] + "..."
