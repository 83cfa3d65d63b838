"""What each caller of an rlkit inference server may see and change: its own LoRA adapters,
its own responses, weights only from the server's roots.

The server's owner holds the server's token (`--rlkit-token-file`, or `RLKIT_TOKEN_FILE`); on a
shared server each run (tenant) holds its own, one `NAME.token` file per tenant in
`--rlkit-tenants-dir` (`rlkit.serving.Credentials`). A tenant loads, replaces, unloads and sees
only its own adapters; the owner sees and may change everything. The caller of each request
is `caller(request)`, so a route can check what the caller signed with the caller's own token.

A tenant's requests also pass `TenantRequests`: one naming another run's adapter as its `model`
gets vLLM's answer for a model that does not exist, and each gets a request id tagged with the
tenant (`request_tag`), so that the routing capture of a response goes to its own run only.
Paths named in a request load only from the roots the server was given (`confine`), with one
error whatever the path is. Who may reach which route at all is `rlkit.inference.auth`.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from rlkit import serving
from rlkit.serving import (
    OWNER,
    Caller,
    Credentials,
    ServiceError,
    TokenFiles,
    caller,
    scope_caller,
    token_files,
)

DEFAULT_MAX_UPDATE_S = 300.0


@dataclass
class ServerSecurity(Credentials):
    """A server's credentials (`rlkit.serving.Credentials`: the owner's token, the tenants'),
    weight roots and limits, kept on `app.state.rlkit_security`."""

    roots: list[Path] = field(default_factory=list)  # weights and adapters load only from here
    max_update_s: float = DEFAULT_MAX_UPDATE_S  # the longest any update may keep the engine paused
    adapter_owners: dict[str, str] = field(default_factory=dict)  # adapter name -> caller name

    def __post_init__(self) -> None:
        super().__post_init__()
        self.roots = [Path(r).resolve() for r in self.roots]

    def may_change(self, caller: Caller, adapter: str, loaded: bool) -> bool:
        """Whether `caller` may load, replace or unload the adapter named `adapter` (`loaded`:
        the engine serves one of that name; one nobody claimed is the owner's, e.g. vLLM's
        `--lora-modules`)."""
        holder = self.adapter_owners.get(adapter, OWNER if loaded else None)
        return caller.owner or holder is None or holder == caller.name

    def visible(self, caller: Caller | None, adapters: dict[str, int]) -> dict[str, int]:
        """The adapters (name -> version) `caller` may see: the owner all, a tenant its own."""
        if caller is None:
            return {}
        if caller.owner:
            return dict(adapters)
        return {n: v for n, v in adapters.items() if self.adapter_owners.get(n) == caller.name}


def request_tag(tenant: str) -> str:
    """The prefix of every request id of `tenant`'s requests (vLLM names a response
    `cmpl-ID`, `chatcmpl-ID`...): a hash, so no tenant's tag is the start of another's."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16] + "."


def owns_response(who: Caller, response_id: str) -> bool:
    """Whether `who` sent the request vLLM answered as `response_id` (the owner: any)."""
    if who.owner:
        return True
    _, sep, request_id = response_id.partition("-")
    return bool(sep) and request_id.startswith(request_tag(who.name))


def no_adapter(name: str) -> ServiceError:
    """The one answer for an adapter a caller may not touch, whether another run holds it or
    nobody does: a name is not told to exist."""
    return ServiceError(404, f"no adapter {name!r} of this run")


def security(request: Request) -> ServerSecurity:
    return request.app.state.rlkit_security


Adapters = Callable[[], dict[str, Any]]  # the adapters vLLM serves, by name


class TenantRequests:
    """ASGI middleware, inside `RequireToken`, for a tenant's requests: their request id is
    tagged with the tenant (`request_tag`, replacing any the client sent, so it cannot pose as
    another), and a body naming another run's adapter (or the owner's) as its `model` gets
    vLLM's own answer for a model it does not serve (`answer_as_unknown`). The body is parsed
    here only while some adapter is not the caller's, then handed on as it came."""

    def __init__(self, app: Any, security: ServerSecurity, adapters: Adapters) -> None:
        self.app = app
        self.security = security
        self.adapters = adapters

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        who = scope_caller(scope)
        if scope["type"] != "http" or who is None or who.owner:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        tagged = request_tag(who.name) + (given.decode("latin-1") if given else uuid.uuid4().hex)
        headers = [(k, v) for k, v in scope["headers"] if k != b"x-request-id"]
        scope = {**scope, "headers": [*headers, (b"x-request-id", tagged.encode("latin-1"))]}
        owners = self.security.adapter_owners
        foreign = {n for n in self.adapters() if owners.get(n) != who.name}
        if scope["method"] != "POST" or not foreign:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        data = json_object(body)
        model = data.get("model")  # as FastAPI reads it: the last of repeated keys
        if isinstance(model, str) and model in foreign:
            await self.answer_as_unknown(scope, data, model, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)

    async def answer_as_unknown(
        self, scope: dict, data: dict, model: str, receive: Any, send: Any
    ) -> None:
        """What vLLM answers (its words, whatever its version) when `model` is a name it does
        not serve: the request goes on with a fresh name nobody holds, which is put back as
        `model` in the answer."""
        stand_in = f"rlkit-{uuid.uuid4().hex}"
        body = json.dumps({**data, "model": stand_in}).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", b"%d" % len(body))]}
        start: dict = {}
        chunks: list[bytes] = []

        async def keep(message: dict) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, replaying(body, receive), keep)
        name = json.dumps(model, ensure_ascii=False)[1:-1].encode()
        answer = b"".join(chunks).replace(stand_in.encode(), name)
        headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", b"%d" % len(answer)))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def read_body(receive: Any) -> bytes:
    """The whole request body (what came of it, if the client went away)."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def replaying(body: bytes, receive: Any) -> Any:
    """A `receive` that hands on `body` first, then what the client sends (its disconnect, which
    vLLM waits for while it answers)."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def json_object(body: bytes) -> dict:
    """The JSON object `body` holds; empty when it holds none."""
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


PATH_REFUSED = (
    "path refused: not inside a directory this server loads weights from "
    "(rlkit infer --allowed-weights-root)"
)


def confine(path: str | Path, roots: list[Path]) -> Path:
    """`rlkit.serving.confine` in this server's words: `path` resolved inside one of `roots`,
    else PathRefused (403), the same whether `path` exists or not."""
    return serving.confine(path, roots, PATH_REFUSED)


def check_path(request: Request, path: str) -> None:
    """403 (PathRefused) unless `path` is inside this server's weight roots (`confine`)."""
    confine(path, security(request).roots)


def claim_adapter(request: Request, name: str, path: str) -> None:
    """403 unless `path` is confined, 404 (`no_adapter`) unless the name is free or the
    caller's own: the caller may load `path` as adapter `name`, which is its from then on."""
    check_path(request, path)
    check_adapter_owner(request, name)
    security(request).adapter_owners.setdefault(name, caller(request).name)


def check_adapter_owner(request: Request, name: str) -> None:
    """404 (`no_adapter`, as for an adapter that does not exist) unless the caller may change
    `name`."""
    sec, who = security(request), caller(request)
    if not sec.may_change(who, name, name in loaded_adapters(request)):
        raise no_adapter(name)


def loaded_adapters(request: Request) -> dict[str, Any]:
    return served_adapters(request.app)


def release_adapter(request: Request, name: str) -> None:
    security(request).adapter_owners.pop(name, None)


def visible_adapters(request: Request, adapters: dict[str, int]) -> dict[str, int]:
    return security(request).visible(caller(request), adapters)


def filter_model_list(sec: ServerSecurity, who: Caller | None, cards: dict) -> dict:
    """vLLM's `/v1/models` answer with only the adapters `who` may see, and no adapter's path
    (a card's `root`) but to the owner."""
    data = []
    for card in cards.get("data", []):
        if card.get("parent"):  # a LoRA adapter
            if who is None or not (who.owner or sec.adapter_owners.get(card["id"]) == who.name):
                continue
            if not who.owner:
                card = {**card, "root": card["id"]}
        data.append(card)
    return {**cards, "data": data}


def served_adapters(app: FastAPI) -> dict[str, Any]:
    """The adapters vLLM serves in `app`, by name."""
    models = getattr(app.state, "openai_serving_models", None)
    return {} if models is None else models.lora_requests


def infer_credentials(
    port: int, token_file: str | Path | None = None, tenants: list[str] | tuple = ()
) -> TokenFiles:
    """`rlkit infer`'s token files (`rlkit.serving.token_files`): the owner's (`token_file`,
    else `$RLKIT_HOME/infer/PORT/token`) and a `NAME.token` per tenant beside it."""
    if token_file is None:
        home = Path(os.environ.get("RLKIT_HOME") or "~/.rlkit").expanduser()
        token_file = home / "infer" / str(port) / "token"
    return token_files(token_file, tenants)
