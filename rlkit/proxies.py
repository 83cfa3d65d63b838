"""The HTTP(S) proxy a client of rlkit's services uses for a URL (the inference and sandbox
clients share it; neither imports the other)."""

from __future__ import annotations

import urllib.parse
import urllib.request


def env_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY / NO_PROXY set for `url`, as the OpenAI client would use it.

    Looked up once per client: aiohttp's own `trust_env` looks it up (and .netrc) on a worker
    thread for every request, which cost as much CPU as the HTTP itself at concurrency 256.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)
