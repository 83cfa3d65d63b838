"""The model's tools: `search`, `open`, `find` over the rollout's corpus, and `answer`.

Tool functions only receive their arguments; the corpus of the running rollout is routed to them
through a context variable set around each environment turn (every rollout runs in its own
asyncio task, and `asyncio.to_thread` copies the context). Errors are raised with a message
written for the model; `ToolEnv` returns them as the tool's reply.
"""

from __future__ import annotations

import contextvars

from deep_research.corpus import Corpus

CORPUS: contextvars.ContextVar[Corpus] = contextvars.ContextVar("deep_research_corpus")
MAX_RESULTS = 20
MAX_LINES = 200


def _corpus() -> Corpus:
    corpus = CORPUS.get(None)
    if corpus is None:
        raise RuntimeError("deep-research tools only work inside a deep-research rollout")
    return corpus


def search(query: str, k: int = 5) -> str:
    """Search the encyclopedia by keywords and list the best-matching articles with their ids.

    Args:
        query: Keywords such as a name, a title or a place.
        k: How many results to list (1 to 20).
    """
    if not 1 <= k <= MAX_RESULTS:
        raise ValueError(f"k must be between 1 and {MAX_RESULTS}, got {k}")
    hits = _corpus().search(query, k)
    if not hits:
        return f"No article matches {query!r}; try other keywords."
    return "\n".join(
        f"{rank}. [{hit.id}] {hit.title} (score {hit.score})\n   {hit.snippet}"
        for rank, hit in enumerate(hits, 1)
    )


def open(doc_id: str, offset: int = 0, length: int = 40) -> str:
    """Read an article: its title and numbered lines.

    Args:
        doc_id: The article id shown in square brackets in the search results.
        offset: The first line to show (0 is the start).
        length: How many lines to show (1 to 200).
    """
    if not 1 <= length <= MAX_LINES:
        raise ValueError(f"length must be between 1 and {MAX_LINES}, got {length}")
    doc, lines = _corpus().open(doc_id, offset, length)
    total = len(doc.lines)
    shown = f"lines {offset}-{offset + len(lines) - 1} of {total}"
    more = f"\n[{total - offset - len(lines)} more lines]" if offset + len(lines) < total else ""
    return f"# {doc.title} [{doc.id}] ({shown})\n" + "\n".join(lines) + more


def find(doc_id: str, pattern: str) -> str:
    """Show only the lines of an article that contain a phrase (case-insensitive).

    Args:
        doc_id: The article id shown in square brackets in the search results.
        pattern: The phrase to look for, e.g. "born" or "founded".
    """
    lines = _corpus().find(doc_id, pattern)
    return "\n".join(lines) if lines else f"No line of {doc_id!r} contains {pattern!r}."


def answer(text: str) -> str:
    """Submit the final answer; this ends the conversation.

    Args:
        text: The answer alone, as short as possible: a name, a year or a place.
    """
    return f"Answer recorded: {text}"


TOOLS = [search, open, find, answer]
