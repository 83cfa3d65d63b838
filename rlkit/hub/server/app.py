"""The hub server: a PEP 503/691 package index, the legacy upload API twine speaks, a JSON API
for environment cards and evaluations, and web pages. `create_app` builds it (the routes:
this module's `router`, one module-level handler each); `serve` runs it.

Authentication: an API token, sent as HTTP basic auth with user ``__token__`` (what pip and
twine send) or as ``Authorization: Bearer``. Reads work anonymously for public environments;
private ones answer 404 to everyone but their owner's tokens. A request carrying an unknown,
revoked or expired token gets 401 saying which, even where anonymous access would do.

Leaderboard: any token may post a result (recorded as claimed, with its submitter); only the
environment's owner or a trusted-runner token may post a reproduction of it, which verifies it
when its mean reward lies within ``verify_tolerance`` of the claim.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlkit.hub.artifacts import ArtifactError, inspect_artifact
from rlkit.hub.base import HubError
from rlkit.hub.names import normalize
from rlkit.hub.readme import render_readme
from rlkit.hub.records import (
    MAX_AUDIT_BYTES,
    AuditRecord,
    EnvCard,
    EnvSummary,
    EvalRecord,
    ReproductionRecord,
    Visibility,
)
from rlkit.hub.server.db import Identity, default_db_url, make_engine
from rlkit.hub.server.store import HubStore
from rlkit.hub.simple import (
    HTML_TYPE,
    JSON_TYPE,
    project_list_html,
    project_list_json,
    project_page_html,
    project_page_json,
)
from rlkit.ports import HUB_PORT
from rlkit.serving import bearer_token, error_body

HERE = Path(__file__).parent
ALIASES = {
    "*/*": "text/html",
    "text/*": "text/html",
    "application/vnd.pypi.simple.latest+json": JSON_TYPE,
    "application/vnd.pypi.simple.latest+html": HTML_TYPE,
}


def request_token(request: Request) -> str | None:
    """The API token in a request's Authorization header (basic `__token__:T` or bearer)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return bearer_token(request.scope)
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password if user == "__token__" and password else None
    return None


def negotiate(request: Request) -> str:
    """PEP 691 content negotiation: JSON or HTML by Accept q-values (or ?format=)."""
    wanted = request.query_params.get("format")
    if wanted in (JSON_TYPE, HTML_TYPE, "text/html"):
        return wanted
    accept = request.headers.get("accept", "")
    if not accept.strip():
        return "text/html"
    best, best_q = None, 0.0
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        choice = ALIASES.get(media, media)
        if choice in (JSON_TYPE, HTML_TYPE, "text/html") and q > best_q:
            best, best_q = choice, q
    if best is None:
        raise HTTPException(406, "supported: application/vnd.pypi.simple.v1+json, text/html")
    return best


class VisibilityBody(BaseModel):
    visibility: Visibility


TEMPLATES = Jinja2Templates(directory=HERE / "templates")
router = APIRouter()


def create_app(
    data_dir: Path,
    db_url: str | None = None,
    max_upload_mb: float = 50.0,
    verify_tolerance: float = 0.05,
) -> FastAPI:
    """Build the hub application storing artifacts under `data_dir/files`."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(db_url or default_db_url(data_dir))
    app = FastAPI(title="rlkit hub", docs_url="/api/docs", redoc_url=None)
    app.state.store = HubStore(engine, data_dir / "files", verify_tolerance)
    app.state.max_upload_mb = max_upload_mb
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_exception_handler(HubError, hub_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.include_router(router)
    return app


async def hub_error(_request: Request, exc: Exception) -> JSONResponse:
    """A refusal of the hub's, in the one error body of rlkit's services (`{"error": message}`,
    `rlkit.serving.error_body`), with a Basic challenge on 401 (what pip and twine answer)."""
    assert isinstance(exc, HubError)
    headers = {"WWW-Authenticate": 'Basic realm="rlkit hub"'} if exc.status == 401 else None
    return JSONResponse(error_body(str(exc)), status_code=exc.status, headers=headers)


async def http_error(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's and the routes' own HTTP errors (404 of an unknown route, 413, 406) in the
    same body."""
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return JSONResponse(error_body(message), status_code=exc.status_code, headers=exc.headers)


async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """A request body or parameter that does not validate: 422 naming each field's problem."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(error_body(validation_message(exc.errors())), status_code=422)


def validation_message(errors: Sequence[Any]) -> str:
    """`loc.path: msg; ...` of pydantic's error list."""
    return "; ".join(
        ".".join(str(part) for part in e.get("loc", ())) + f": {e.get('msg', '')}" for e in errors
    )


def store_of(request: Request) -> HubStore:
    return request.app.state.store


def viewer(request: Request) -> str | None:
    """The owner whose token the request carries (None: anonymous)."""
    return store_of(request).owner_of(request_token(request))


def require_identity(request: Request) -> Identity:
    identity = store_of(request).identify(request_token(request))
    if identity is None:
        raise HubError("missing API token", 401)
    return identity


def require_owner(request: Request) -> str:
    return require_identity(request).owner


# ---- PEP 503 / 691 simple index and files ----
def _index_response(kind: str, html_text: str, payload: dict) -> Response:
    if kind == JSON_TYPE:
        return JSONResponse(payload, media_type=JSON_TYPE)
    return HTMLResponse(html_text, media_type=kind)


@router.get("/simple/")
def simple_index(request: Request) -> Response:
    kind = negotiate(request)
    names = store_of(request).project_names(viewer(request))
    return _index_response(kind, project_list_html(names), project_list_json(names))


@router.get("/simple/{name}/")
def simple_project(name: str, request: Request) -> Response:
    if normalize(name) != name:
        return RedirectResponse(f"../{normalize(name)}/", status_code=301)
    kind = negotiate(request)
    versions, files = store_of(request).index_files(name, viewer(request))
    return _index_response(
        kind, project_page_html(name, files), project_page_json(name, versions, files)
    )


@router.get("/simple/{name}")
def simple_project_slash(name: str) -> RedirectResponse:
    return RedirectResponse(f"{normalize(name)}/", status_code=301)


@router.get("/files/{name}/{filename}")
def download(name: str, filename: str, request: Request) -> FileResponse:
    path = store_of(request).file_path(name, filename, viewer(request))
    return FileResponse(path, media_type="application/octet-stream", filename=filename)


# ---- legacy upload API (what `twine upload` speaks) ----
@router.post("/legacy/")
@router.post("/legacy", include_in_schema=False)  # twine refuses redirects: accept both
async def upload(request: Request) -> Response:
    owner = await run_in_threadpool(require_owner, request)
    max_upload_mb = request.app.state.max_upload_mb
    max_bytes = int(max_upload_mb * 1024 * 1024)
    length = request.headers.get("content-length", "0")
    if not length.isdigit():
        raise HTTPException(400, "invalid Content-Length")
    if int(length) > max_bytes:
        raise HTTPException(413, f"upload larger than the {max_upload_mb:g} MB limit")
    form = await request.form(max_files=1, max_fields=200, max_part_size=8 * 1024 * 1024)
    if form.get(":action") != "file_upload":
        raise HTTPException(400, "only :action=file_upload is supported")
    content = form.get("content")
    if not isinstance(content, UploadFile) or not content.filename:
        raise HTTPException(400, "missing 'content' file part")
    data = await content.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise HTTPException(413, f"upload larger than the {max_upload_mb:g} MB limit")
    try:
        info = inspect_artifact(data, content.filename)
    except ArtifactError as exc:
        raise HTTPException(400, str(exc)) from exc
    if normalize(str(form.get("name", ""))) != info.name or str(form.get("version", "")) not in (
        "",
        info.version,
    ):
        raise HTTPException(400, "form name/version do not match the uploaded file")
    digest = str(form.get("sha256_digest", "") or "")
    if digest and digest.lower() != info.sha256:
        raise HTTPException(400, "sha256_digest does not match the uploaded content")
    await run_in_threadpool(store_of(request).upload, owner, info, data)
    return Response("OK", media_type="text/plain")


# ---- JSON API ----
@router.get("/api/v1/whoami")
def whoami(request: Request) -> dict:
    return {"owner": require_owner(request)}


@router.get("/api/v1/envs")
def list_envs(
    request: Request, q: str = "", tag: Annotated[str | None, Query()] = None
) -> list[EnvSummary]:
    return store_of(request).search(viewer(request), q, tag)


@router.get("/api/v1/envs/{owner}/{name}")
def env_card(owner: str, name: str, request: Request) -> EnvCard:
    return store_of(request).card(owner, normalize(name), viewer(request))


@router.put("/api/v1/envs/{owner}/{name}")
def set_visibility(owner: str, name: str, body: VisibilityBody, request: Request) -> dict:
    by = require_owner(request)
    store_of(request).set_visibility(owner, normalize(name), by, body.visibility)
    return {"owner": owner, "name": normalize(name), "visibility": body.visibility}


@router.post("/api/v1/envs/{owner}/{name}/{version}/audit", status_code=201)
async def set_audit(owner: str, name: str, version: str, request: Request) -> AuditRecord:
    """The version's `rlkit env audit` record (its owner only, once): a JSON body of at most
    MAX_AUDIT_BYTES, read with that bound and validated as an AuditRecord."""
    by = await run_in_threadpool(require_owner, request)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_AUDIT_BYTES):
        raise HTTPException(413, f"an audit record is at most {MAX_AUDIT_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_AUDIT_BYTES:
            raise HTTPException(413, f"an audit record is at most {MAX_AUDIT_BYTES} bytes")
    try:
        record = AuditRecord.model_validate_json(bytes(body))
    except ValidationError as exc:
        raise HTTPException(422, validation_message(exc.errors())) from None
    store = store_of(request)
    return await run_in_threadpool(store.set_audit, owner, normalize(name), version, record, by)


@router.post("/api/v1/envs/{owner}/{name}/{version}/evals", status_code=201)
def add_eval(
    owner: str, name: str, version: str, record: Annotated[EvalRecord, Body()], request: Request
) -> EvalRecord:
    by = require_owner(request)
    return store_of(request).add_eval(owner, normalize(name), version, record, by)


@router.post("/api/v1/envs/{owner}/{name}/{version}/evals/{eval_id}/reproductions", status_code=201)
def add_reproduction(
    owner: str,
    name: str,
    version: str,
    eval_id: int,
    record: Annotated[ReproductionRecord, Body()],
    request: Request,
) -> EvalRecord:
    runner = require_identity(request)
    store = store_of(request)
    return store.add_reproduction(owner, normalize(name), version, eval_id, record, runner)


# ---- web pages ----
@router.get("/", response_class=HTMLResponse)
def page_list(request: Request, q: str = "", tag: str | None = None) -> HTMLResponse:
    envs = store_of(request).search(viewer(request), q, tag or None)
    return TEMPLATES.TemplateResponse(
        request, "list.html", {"envs": envs, "q": q, "tag": tag or ""}
    )


@router.get("/envs/{owner}/{name}", response_class=HTMLResponse)
def page_env(owner: str, name: str, request: Request) -> HTMLResponse:
    card = store_of(request).card(owner, normalize(name), viewer(request))
    board = sorted(card.evals, key=lambda e: (e.status == "verified", e.mean_reward), reverse=True)
    base = str(request.base_url).rstrip("/")
    return TEMPLATES.TemplateResponse(
        request,
        "env.html",
        {
            "card": card,
            "readme_html": render_readme(card.readme, card.readme_content_type),
            "leaderboard": board,
            "pass_keys": sorted({k for e in board for k in e.pass_at_k}, key=_k_order),
            "audit": card.latest_audit,
            "hub_url": base,
        },
    )


def _k_order(key: str) -> tuple[int, str]:
    digits = "".join(c for c in key if c.isdigit())
    return (int(digits) if digits else 0, key)


def serve(
    data_dir: Path,
    db_url: str | None = None,
    host: str = "127.0.0.1",
    port: int = HUB_PORT,
    max_upload_mb: float = 50.0,
    verify_tolerance: float = 0.05,
    log_level: Literal["info", "warning", "error"] = "info",
) -> None:
    """Run the hub with uvicorn until interrupted."""
    import uvicorn

    app = create_app(data_dir, db_url, max_upload_mb, verify_tolerance)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
