"""The headless-browser harness of the web tests (the hub's pages, `rlkit runs show --html`):
the system chromium driven by playwright, with no network, sandbox or first-run work."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.system import require_system

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A playwright Browser on the system chromium (skipped locally, failed in CI, without it)."""
    require_system("chromium", shutil.which("chromium") is not None, "apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def assert_rendered(shot: Path, size: tuple[int, int]) -> None:
    """The screenshot has the viewport's size and is not a blank page."""
    from PIL import Image, ImageStat

    image = Image.open(shot).convert("L")
    assert image.size == size
    assert ImageStat.Stat(image).stddev[0] > 10
