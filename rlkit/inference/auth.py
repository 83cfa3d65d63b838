"""Who may talk to an rlkit inference server, what they see, and where weights may come from.

Every route but liveness (`/health`, `/ping`) needs `Authorization: Bearer TOKEN`, checked
before the request's body is read: no credential is a 401, a wrong one a 403. The server's
owner holds the server's token (`--rlkit-token-file`, or `RLKIT_TOKEN_FILE`); on a shared
server each run (tenant) holds its own, one `NAME.token` file per tenant in
`--rlkit-tenants-dir`. A tenant loads, replaces, unloads and sees only its own LoRA adapters;
the owner sees and may change everything. The caller of each request is on
`request.state.rlkit_caller` (`caller(request)`), so a route can check what the caller signed
with the caller's own token.

A tenant's requests also pass `TenantRequests`: one naming another run's adapter as its `model`
gets vLLM's answer for a model that does not exist, and each gets a request id tagged with the
tenant (`request_tag`), so that the routing capture of a response goes to its own run only.
vLLM's Prometheus `/metrics` (which names every adapter in use) is the owner's.

vLLM's runtime LoRA routes (`/v1/load_lora_adapter`, ...) are refused to everyone: adapters
load through rlkit's tenant-aware `/rlkit/load_adapter` only. Paths named in a request load only
from the roots the server was given (`confine`), with one error whatever the path is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from rlkit.errors import UsageError
from rlkit.protocol.credentials import read_token

PUBLIC_PATHS = frozenset({"/health", "/ping"})  # liveness and readiness, nothing else
# vLLM's own adapter routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING): no tenant check, any path
REFUSED_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
# what changes the engine for every run on it, or shows every run's adapters: the owner only
OWNER_PATHS = frozenset({"/rlkit/update_weights", "/rlkit/pause", "/rlkit/resume", "/metrics"})
OWNER = "owner"
WRONG_TOKEN = (
    "wrong credential: not a token of this server (`rlkit infer` prints its token file; a "
    "run gives it as inference.token_file, `rlkit eval` as --token-file)"
)
TOKEN_SUFFIX = ".token"
DEFAULT_MAX_UPDATE_S = 300.0


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the server's owner, or the tenant `name`, with their token."""

    name: str
    token: str = field(repr=False)

    @property
    def owner(self) -> bool:
        return self.name == OWNER


def load_tenants(folder: str | Path | None) -> dict[str, str]:
    """Tenant name -> token, from every `NAME.token` file in `folder` (each checked private)."""
    if folder is None:
        return {}
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"tenants directory {folder} not found")
    return {p.name[: -len(TOKEN_SUFFIX)]: read_token(p) for p in folder.glob(f"*{TOKEN_SUFFIX}")}


@dataclass
class ServerSecurity:
    """A server's credentials, weight roots and limits, kept on `app.state.rlkit_security`."""

    owner_token: str = field(repr=False)
    tenants: dict[str, str] = field(default_factory=dict, repr=False)  # name -> token
    roots: list[Path] = field(default_factory=list)  # weights and adapters load only from here
    max_update_s: float = DEFAULT_MAX_UPDATE_S  # the longest any update may keep the engine paused
    adapter_owners: dict[str, str] = field(default_factory=dict)  # adapter name -> caller name

    def __post_init__(self) -> None:
        self.roots = [Path(r).resolve() for r in self.roots]
        if OWNER in self.tenants:
            raise UsageError(f"a tenant cannot be named {OWNER!r}")

    def identify(self, token: str) -> Caller | None:
        """The caller holding `token`, or None (every comparison in constant time)."""
        found = None
        for name, known in [(OWNER, self.owner_token), *self.tenants.items()]:
            if hmac.compare_digest(token.encode(), known.encode()):
                found = Caller(name, known)
        return found

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


def owner_only(path: str) -> bool:
    return path in OWNER_PATHS or path.startswith("/metrics/")


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


def no_adapter(name: str) -> HTTPException:
    """The one answer for an adapter a caller may not touch, whether another run holds it or
    nobody does: a name is not told to exist."""
    return HTTPException(status_code=404, detail=f"no adapter {name!r} of this run")


def bearer_token(scope: dict[str, Any]) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def scope_caller(scope: dict[str, Any]) -> Caller | None:
    return scope.get("state", {}).get("rlkit_caller")


def caller(request: Request) -> Caller:
    """The authenticated caller of `request` (the middleware let it through)."""
    return request.state.rlkit_caller


def security(request: Request) -> ServerSecurity:
    return request.app.state.rlkit_security


class RequireToken:
    """ASGI middleware: refuse a request without the owner's or a tenant's token before any of
    its body is read, and record who sent it."""

    def __init__(self, app: Any, security: ServerSecurity) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        if path in REFUSED_PATHS:
            await self._refuse(scope, send, 404, "load adapters with /rlkit/load_adapter")
            return
        token = bearer_token(scope)
        if token is None:
            await self._refuse(
                scope, send, 401, "no credential: send 'Authorization: Bearer TOKEN'"
            )
            return
        found = self.security.identify(token)
        if found is None:
            await self._refuse(scope, send, 403, WRONG_TOKEN)
            return
        if owner_only(path) and not found.owner:
            await self._refuse(scope, send, 403, "only the server's owner may do this")
            return
        scope.setdefault("state", {})["rlkit_caller"] = found
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: dict, send: Any, status: int, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        await send_json(send, status, {"error": message}, extra)


async def send_json(send: Any, status: int, content: dict, extra: list | None = None) -> None:
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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


class PathRefused(UsageError):
    """A path outside the server's weight roots (the same words whether it exists or not)."""


def confine(path: str | Path, roots: list[Path]) -> Path:
    """`path` resolved (`..` and symlinks followed) when it lies inside one of `roots`; else
    PathRefused, whose message says nothing about whether `path` exists."""
    try:
        resolved = Path(path).resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        resolved = None
    if resolved is None or not any(resolved.is_relative_to(root) for root in roots):
        raise PathRefused(PATH_REFUSED)
    return resolved


def check_path(request: Request, path: str) -> None:
    """403 unless `path` is inside this server's weight roots (`confine`)."""
    try:
        confine(path, security(request).roots)
    except PathRefused as exc:
        raise HTTPException(status_code=403, detail=str(exc)) from None


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


def model_list_route(show: Any, sec: ServerSecurity) -> Any:
    """`/v1/models` around vLLM's own endpoint `show` (raw_request -> JSONResponse)."""

    async def list_models(raw_request: Request) -> JSONResponse:
        answer = await show(raw_request)
        cards = filter_model_list(sec, caller(raw_request), json.loads(answer.body))
        return JSONResponse(cards, status_code=answer.status_code)

    return list_models


def served_adapters(app: FastAPI) -> dict[str, Any]:
    """The adapters vLLM serves in `app`, by name."""
    models = getattr(app.state, "openai_serving_models", None)
    return {} if models is None else models.lora_requests


def install_auth(app: FastAPI, sec: ServerSecurity) -> None:
    """Require a token on every route of vLLM's `app` (outermost middleware: add it after the
    others), keep tenants to their own adapters and answer `/v1/models` with the caller's
    adapters only."""
    app.state.rlkit_security = sec
    for route in list(app.router.routes):
        if getattr(route, "path", None) == "/v1/models":
            app.router.routes.remove(route)
            app.add_api_route("/v1/models", model_list_route(route.endpoint, sec), methods=["GET"])
    app.middleware_stack = None  # vLLM built it already; Starlette rebuilds it on first call
    app.add_middleware(TenantRequests, security=sec, adapters=lambda: served_adapters(app))
    app.add_middleware(RequireToken, security=sec)
