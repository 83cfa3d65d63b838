"""Helpers for tests that talk to a real hub server over HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import httpx
import uvicorn
from fastapi import FastAPI

from rlkit.inference.lifecycle import free_port


class HasUrl(Protocol):
    url: str


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """Run `app` with uvicorn in a background thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "hub server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def upload(
    hub: HasUrl, token: str | None, filename: str, data: bytes, **fields: str
) -> httpx.Response:
    """One legacy-API upload, exactly the form twine sends."""
    name, version = filename.split("-")[0].replace("_", "-"), filename.split("-")[1]
    version = version.removesuffix(".tar.gz")
    form = {
        ":action": "file_upload",
        "protocol_version": "1",
        "name": name,
        "version": version,
        "sha256_digest": hashlib.sha256(data).hexdigest(),
        **fields,
    }
    auth = ("__token__", token) if token is not None else None
    return httpx.post(
        f"{hub.url}/legacy/",
        data=form,
        files={"content": (filename, data, "application/octet-stream")},
        auth=auth,
        timeout=60,
    )
