"""Safe README rendering: Markdown with raw HTML disabled, then an allow-list sanitiser.

Two layers on purpose: markdown-it escapes any HTML in the source, and nh3 strips whatever a
Markdown construct could still smuggle in (e.g. ``javascript:`` links), so a README from an
untrusted uploader renders inert.
"""

from __future__ import annotations

import html

import nh3
from markdown_it import MarkdownIt

_md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


def render_readme(text: str, content_type: str = "text/markdown") -> str:
    """HTML for a README; plain-text READMEs are escaped into a <pre> block."""
    if content_type.startswith("text/markdown") or not content_type:
        rendered = _md.render(text or "")
    else:
        rendered = f"<pre>{html.escape(text or '')}</pre>"
    return nh3.clean(
        rendered, url_schemes={"http", "https", "mailto"}, link_rel="nofollow noopener"
    )
