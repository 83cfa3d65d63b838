"""Who may reach which route of an rlkit inference server: its rules for `rlkit.serving`'s
token check, installed on vLLM's app by `install_auth`.

Every route but liveness (`/health`, `/ping`) needs `Authorization: Bearer TOKEN` of the owner
or a tenant, checked before the request's body is read: no credential is a 401, a wrong one a
403. What changes the engine for every run on it is the owner's: rlkit's routes say so where
they are declared (`rlkit.inference.routes.ROUTES`), and of vLLM's routes its Prometheus
`/metrics` (it names every adapter in use). vLLM's runtime LoRA routes
(`/v1/load_lora_adapter`, ...) are refused to everyone: adapters load through rlkit's
tenant-aware `/rlkit/load_adapter` only. What each caller may see and change once it is in is
`rlkit.inference.tenancy`.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlkit import serving
from rlkit.inference import routes
from rlkit.inference.tenancy import (
    ServerSecurity,
    TenantRequests,
    filter_model_list,
    served_adapters,
)
from rlkit.serving import ServiceError, caller, error_response

PUBLIC_PATHS = frozenset({"/health", "/ping"})  # liveness and readiness, nothing else
# vLLM's own adapter routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING): no tenant check, any path
REFUSED_PATHS = dict.fromkeys(
    ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"), "load adapters with /rlkit/load_adapter"
)
VLLM_METRICS = "/metrics"  # vLLM's Prometheus metrics (a mount: /metrics/... too)
OWNER_PATHS = routes.OWNER_PATHS | {VLLM_METRICS}
WRONG_TOKEN = (
    "wrong credential: not a token of this server (`rlkit infer` prints its token file; a "
    "run gives it as inference.token_file, `rlkit eval` as --token-file)"
)


def owner_only(path: str) -> bool:
    return path in OWNER_PATHS or path.startswith(VLLM_METRICS + "/")


class RequireToken(serving.RequireToken):
    """`rlkit.serving.RequireToken` with the inference server's rules (this module's)."""

    def __init__(self, app: Any, security: ServerSecurity) -> None:
        super().__init__(
            app,
            security,
            public=PUBLIC_PATHS,
            refused=REFUSED_PATHS,
            owner_only=owner_only,
            wrong_token=WRONG_TOKEN,
        )


def model_list_route(show: Any, sec: ServerSecurity) -> Any:
    """`/v1/models` around vLLM's own endpoint `show` (raw_request -> JSONResponse)."""

    async def list_models(raw_request: Request) -> JSONResponse:
        answer = await show(raw_request)
        cards = filter_model_list(sec, caller(raw_request), json.loads(answer.body))
        return JSONResponse(cards, status_code=answer.status_code)

    return list_models


def install_auth(app: FastAPI, sec: ServerSecurity) -> None:
    """Require a token on every route of vLLM's `app` (outermost middleware: add it after the
    others), keep tenants to their own adapters, answer `/v1/models` with the caller's adapters
    only, and answer every refusal of rlkit's as `{"error": message}`."""
    app.state.rlkit_security = sec
    app.add_exception_handler(ServiceError, error_response)
    for route in list(app.router.routes):
        if getattr(route, "path", None) == "/v1/models":
            app.router.routes.remove(route)
            app.add_api_route("/v1/models", model_list_route(route.endpoint, sec), methods=["GET"])
    app.middleware_stack = None  # vLLM built it already; Starlette rebuilds it on first call
    app.add_middleware(TenantRequests, security=sec, adapters=lambda: served_adapters(app))
    app.add_middleware(RequireToken, security=sec)
