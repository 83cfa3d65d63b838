"""PEP 503 (HTML) and PEP 691 (JSON) simple-index documents.

Shared by the server (rendered per request) and the local directory hub (written as static
files, so ``pip install --index-url file://.../simple`` works without a server).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urldefrag

from rlkit.hub.records import EnvCard

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
META = {"api-version": "1.1"}


@dataclass
class IndexFile:
    filename: str
    url: str  # relative or absolute, without the hash fragment
    sha256: str
    size: int
    requires_python: str = ""
    upload_time: str = ""


def index_entries(card: EnvCard) -> list[IndexFile]:
    """Every file of every version of `card`, linked relative to its project page."""
    return [
        IndexFile(
            f.filename,
            f"../../files/{card.name}/{f.filename}",
            f.sha256,
            f.size,
            f.requires_python,
            f.upload_time,
        )
        for v in card.versions
        for f in v.files
    ]


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.1">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )


def project_list_html(names: list[str], href: str = "{name}/") -> str:
    links = "".join(
        f'<a href="{html.escape(href.format(name=n))}">{html.escape(n)}</a>\n' for n in names
    )
    return _page("Simple index", links)


def project_list_json(names: list[str]) -> dict:
    return {"meta": META, "projects": [{"name": n} for n in names]}


def project_page_html(name: str, files: list[IndexFile]) -> str:
    links = []
    for f in files:
        attrs = f'href="{html.escape(f.url)}#sha256={f.sha256}"'
        if f.requires_python:
            attrs += f' data-requires-python="{html.escape(f.requires_python)}"'
        links.append(f"<a {attrs}>{html.escape(f.filename)}</a><br>\n")
    return _page(f"Links for {name}", f"<h1>Links for {html.escape(name)}</h1>\n" + "".join(links))


def project_page_json(name: str, versions: list[str], files: list[IndexFile]) -> dict:
    return {
        "meta": META,
        "name": name,
        "versions": versions,
        "files": [
            {
                "filename": f.filename,
                "url": f.url,
                "hashes": {"sha256": f.sha256},
                "requires-python": f.requires_python or None,
                "size": f.size,
                "upload-time": f.upload_time or None,
            }
            for f in files
        ],
    }


class _HashLinks(HTMLParser):
    """Collects `<a href="...#sha256=HEX">FILENAME</a>` links of a PEP 503 project page."""

    def __init__(self) -> None:
        super().__init__()
        self.hashes: dict[str, str] = {}
        self._fragment: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._fragment = urldefrag(dict(attrs).get("href") or "").fragment

    def handle_data(self, data: str) -> None:
        if self._fragment is not None and self._fragment.startswith("sha256="):
            self.hashes[data.strip()] = self._fragment.removeprefix("sha256=")
        self._fragment = None


def hashes_from_project_page(page: str) -> dict[str, str]:
    """{filename: sha256} as a PEP 503 project page lists them (the `#sha256=` fragments)."""
    parser = _HashLinks()
    parser.feed(page)
    return parser.hashes
