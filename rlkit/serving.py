"""What every rlkit HTTP service shares: who is calling, which routes are the owner's, where a
named path may lead, and how a refusal is answered.

Each service states its own rules with these parts and takes none of another's: the inference
server (`rlkit.inference.auth`, `rlkit.inference.routes`), the sandbox service
(`rlkit.sandbox.service`) and the hub (`rlkit.hub.server.app`).

- A caller (`Caller`) is the service's owner or a named tenant, each holding a token of its own
  (`Credentials.identify`: token -> caller, every comparison in constant time).
- `RequireToken` (ASGI middleware) answers a request without a known token before any of its
  body is read: 401 without a credential, 403 with a wrong one or from a tenant on a route the
  service declares the owner's. The handler reads the caller with `caller(request)`.
- `Endpoint` declares one route with its rule beside it (`owner_only`); `owner_paths` is what
  the middleware checks, taken from the same declarations the router is built from.
- One error style: a handler raises `ServiceError(status, message, headers)`, and the service
  answers it with one body, `{"error": message}` (`error_response`, `send_error`).
- `confine(path, roots)`: a named path resolved inside one of `roots`, or `PathRefused` (403)
  with the same words whether the path exists or not.
- `guarded_http()`: uvicorn's HTTP protocol with the limits that hold before any credential is
  read: a request's headers must arrive whole within `HEADER_TIMEOUT_S` of its first byte (or of
  the connection's opening) and within `MAX_HEADER_BYTES`, and at most `MAX_CONNECTIONS` are
  open at once; an idle or trickling connection is closed, whoever holds it. A 401 or 403 closes
  its connection, so nothing more of that request (its body) is read.
"""

from __future__ import annotations

import functools
import hmac
import json
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from rlkit.errors import UsageError
from rlkit.protocol.credentials import ensure_token_file, read_token

OWNER = "owner"
TOKEN_SUFFIX = ".token"
NO_CREDENTIAL = "no credential: send 'Authorization: Bearer TOKEN'"
OWNERS_ONLY = "only the server's owner may do this"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the service's owner, or the tenant `name`, with their token."""

    name: str
    token: str = field(repr=False)

    @property
    def owner(self) -> bool:
        return self.name == OWNER


@dataclass
class Credentials:
    """The tokens a service accepts: its owner's and one per tenant (name -> token)."""

    owner_token: str = field(repr=False)
    tenants: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if OWNER in self.tenants:
            raise UsageError(f"a tenant cannot be named {OWNER!r}")

    def identify(self, token: str) -> Caller | None:
        """The caller holding `token`, or None (every comparison in constant time)."""
        found = None
        for name, known in [(OWNER, self.owner_token), *self.tenants.items()]:
            if hmac.compare_digest(token.encode(), known.encode()):
                found = Caller(name, known)
        return found


def load_tenants(folder: str | Path | None) -> dict[str, str]:
    """Tenant name -> token, from every `NAME.token` file in `folder` (each checked private)."""
    if folder is None:
        return {}
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"tenants directory {folder} not found")
    return {p.name[: -len(TOKEN_SUFFIX)]: read_token(p) for p in folder.glob(f"*{TOKEN_SUFFIX}")}


@dataclass
class TokenFiles:
    """The token files of one service: its owner's and one per tenant (`tenants/NAME.token`)."""

    token_file: Path
    tenants_dir: Path | None
    tenant_files: dict[str, Path]


def token_files(token_file: str | Path, tenants: list[str] | tuple = ()) -> TokenFiles:
    """The owner's token file (created 0600 when missing, kept across restarts) and a
    `NAME.token` per tenant in `tenants/` beside it, each created when missing."""
    token_file = Path(token_file).resolve()
    token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    ensure_token_file(token_file)  # an existing file must be private
    tenants_dir = token_file.parent / "tenants" if tenants else None
    files = {}
    for name in tenants:
        if not name or "/" in name or name.startswith(".") or name == OWNER:
            raise UsageError(f"--tenant {name!r}: a plain name other than 'owner'")
        files[name] = token_file.parent / "tenants" / f"{name}{TOKEN_SUFFIX}"
        files[name].parent.mkdir(exist_ok=True, mode=0o700)
        ensure_token_file(files[name])
    return TokenFiles(token_file, tenants_dir, files)


def bearer_token(scope: dict[str, Any]) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header in an ASGI scope."""
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def scope_caller(scope: dict[str, Any]) -> Caller | None:
    return scope.get("state", {}).get("rlkit_caller")


def caller(request: Request) -> Caller:
    """The authenticated caller of `request` (`RequireToken` let it through)."""
    return request.state.rlkit_caller


@dataclass(frozen=True)
class Endpoint:
    """One route of a service with its rule beside it: `owner_only` routes refuse tenants (403)
    before the body is read."""

    method: str
    path: str
    handler: Callable[..., Any]
    owner_only: bool = False


def owner_paths(endpoints: list[Endpoint] | tuple[Endpoint, ...], prefix: str = "") -> frozenset:
    """The full paths of the owner's routes among `endpoints` (mounted under `prefix`)."""
    return frozenset(prefix + e.path for e in endpoints if e.owner_only)


class ServiceError(HTTPException):
    """A request a service refuses: answered as `{"error": message}` with `status` (and
    `headers`, e.g. Retry-After) by `error_response`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)

    @property
    def message(self) -> str:
        return self.detail


def error_body(message: str) -> dict[str, str]:
    """The one error body of rlkit's services."""
    return {"error": message}


async def error_response(_request: Request, exc: Exception) -> JSONResponse:
    """The exception handler of `ServiceError` (register it on the app)."""
    assert isinstance(exc, ServiceError)
    return JSONResponse(error_body(exc.message), status_code=exc.status_code, headers=exc.headers)


async def send_json(send: Any, status: int, content: dict, extra: list | None = None) -> None:
    """A whole JSON response on a raw ASGI `send` (middleware, before any route runs)."""
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(scope: dict, send: Any, status: int, message: str) -> None:
    """`error_body(message)` with `status` from middleware (a websocket is closed instead)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
    if status in (401, 403):  # the caller is not let in: read nothing more from it
        extra.append((b"connection", b"close"))
    await send_json(send, status, error_body(message), extra)


def nobody_else(path: str) -> bool:
    return False


class RequireToken:
    """ASGI middleware: refuse a request without a token `credentials` knows before any of its
    body is read, and record who sent it. The service's rules are parameters: `public` paths
    need no token, `refused` paths (path -> why) are a 404 to everyone, `owner_only(path)`
    routes refuse tenants (403)."""

    def __init__(
        self,
        app: Any,
        credentials: Credentials,
        *,
        public: frozenset[str] = frozenset({"/health"}),
        refused: dict[str, str] | None = None,
        owner_only: Callable[[str], bool] = nobody_else,
        wrong_token: str = "wrong credential: not a token of this server",
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.public = public
        self.refused = refused or {}
        self.owner_only = owner_only
        self.wrong_token = wrong_token

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in self.public:
            await self.app(scope, receive, send)
            return
        if path in self.refused:
            await send_error(scope, send, 404, self.refused[path])
            return
        token = bearer_token(scope)
        if token is None:
            await send_error(scope, send, 401, NO_CREDENTIAL)
            return
        found = self.credentials.identify(token)
        if found is None:
            await send_error(scope, send, 403, self.wrong_token)
            return
        if self.owner_only(path) and not found.owner:
            await send_error(scope, send, 403, OWNERS_ONLY)
            return
        scope.setdefault("state", {})["rlkit_caller"] = found
        await self.app(scope, receive, send)


PATH_REFUSED = "path refused: not inside a directory this server may read"


class PathRefused(ServiceError):
    """A path outside the service's roots (the same words whether it exists or not): 403."""

    def __init__(self, message: str = PATH_REFUSED) -> None:
        super().__init__(403, message)

    def __str__(self) -> str:
        return self.message


def confine(path: str | Path, roots: list[Path], refusal: str = PATH_REFUSED) -> Path:
    """`path` resolved (`..` and symlinks followed) when it lies inside one of `roots`; else
    PathRefused(`refusal`), whose words say nothing about whether `path` exists."""
    try:
        resolved = Path(path).resolve()
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        resolved = None
    if resolved is None or not any(resolved.is_relative_to(root) for root in roots):
        raise PathRefused(refusal)
    return resolved


# Before any credential is read: how long a request's headers may take to arrive, how large they
# may be, and how many connections may be open at once (`guarded_http`).
HEADER_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 16 * 1024


def max_connections() -> int:
    """Connections open at once at most: half the descriptors this process may open (the
    other half for its own work: a sandbox service's pipes), at least 256."""
    return max(256, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2)


def raise_descriptor_limit() -> None:
    """Raise this process's descriptor limit to its hard limit (a service's connections)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@functools.cache
def guarded_http() -> type:
    """uvicorn's HTTP protocol (httptools', else h11's) with limits that hold before any
    credential is read, for `uvicorn.run(http=guarded_http(), ...)`.

    A connection waiting for a request's headers (just opened, or a request begun after the
    previous answer) gets `HEADER_TIMEOUT_S` and `MAX_HEADER_BYTES` for them, then is answered
    408 / 431 and closed; a connection beyond `max_connections()` is answered 429 (Retry-After:
    1, which rlkit's clients honour) and closed. An idle kept connection is closed by uvicorn's
    own keep-alive timeout."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools not installed
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    cap = max_connections()

    class GuardedHttp(Base):  # type: ignore[misc, valid-type]
        _deadline: Any = None
        _awaiting: Any = None  # the cycle that was current when the wait for headers began
        _received = 0  # bytes received since then

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > cap:
                self._refuse(429, "Too Many Requests", b"retry-after: 1\r\n")
                return
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return  # refused: nothing more is parsed
            idle = self.cycle is None or self.cycle.response_complete
            if self._deadline is None and idle:
                self._await_headers()
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._awaiting:
                self._deadline.cancel()  # the headers are in
                self._deadline = None
            elif self._deadline is not None:
                self._received += len(data)
                if self._received > MAX_HEADER_BYTES:
                    self._refuse(431, "Request Header Fields Too Large")

        def _await_headers(self) -> None:
            self._awaiting, self._received = self.cycle, 0
            self._deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._too_slow)

        def _too_slow(self) -> None:
            self._deadline = None
            if self.cycle is self._awaiting:
                self._refuse(408, "Request Timeout")

        def _refuse(self, status: int, reason: str, extra: bytes = b"") -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if not self.transport.is_closing():
                head = f"HTTP/1.1 {status} {reason}\r\nconnection: close\r\n".encode()
                self.transport.write(head + extra + b"content-length: 0\r\n\r\n")
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            if not self.transport.is_closing():
                super().send_400_response(msg)

    return GuardedHttp


def guarded_uvicorn_options() -> dict[str, Any]:
    """What `uvicorn.run` takes to serve with `guarded_http()` (and h11's own header cap)."""
    return {"http": guarded_http(), "h11_max_incomplete_event_size": MAX_HEADER_BYTES}
