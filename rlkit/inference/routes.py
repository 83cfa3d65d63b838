"""rlkit's own routes of the inference server (`/rlkit/...`, listed in
`rlkit.inference.server`'s docstring): one module-level handler each, declared in `ROUTES` with
who may call it, and the engine calls behind them. A handler refuses by raising
`rlkit.serving.ServiceError`, answered as `{"error": message}`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from rlkit.errors import UsageError
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.inference.tenancy import (
    check_adapter_owner,
    check_path,
    claim_adapter,
    no_adapter,
    owns_response,
    release_adapter,
    security,
    visible_adapters,
)
from rlkit.inference.weights import check_adapter_dir, check_signature
from rlkit.protocol.credentials import digest_key, rendezvous_secret
from rlkit.protocol.weights import VERSION_FILE, PublishedVersion
from rlkit.serving import Endpoint, ServiceError, caller, owner_paths
from rlkit.weights.transport import Reception

log = logging.getLogger("rlkit.inference.server")


class UpdateWeightsRequest(BaseModel):
    path: str  # the published version's directory (its record, and files for `filesystem`)
    version: int | None = None
    rank: int = 0  # broadcast: this server's first worker's rank in the update's group


class LoadAdapterRequest(BaseModel):
    name: str
    path: str
    version: int


class UnloadAdapterRequest(BaseModel):
    name: str


class PolicyState:
    """Per-server policy bookkeeping kept on ``app.state.rlkit``."""

    def __init__(
        self, model: str, reference: dict[str, Any] | None, routing: str | None = None
    ) -> None:
        self.model = model
        self.version = 0
        self.reference = reference
        self.lock = asyncio.Lock()
        self.updating = False
        self.routing = routing  # "vllm" (in responses), "capture" (/rlkit/routing) or None
        self.capture_on = False
        self.adapters: dict[str, int] = {}  # LoRA adapter name -> its policy version
        # paused through `/rlkit/pause` (vLLM's own pause routes are off: only rlkit's routes
        # pause), known here without asking the engine core on every update
        self.paused = False


async def ensure_capture(state: PolicyState, engine: Any) -> None:
    """Turn the workers' routing capture on (once; the engine exists only after startup)."""
    if state.routing != "capture" or state.capture_on:
        return
    async with state.lock:
        if not state.capture_on:
            await engine.collective_rpc("rlkit_enable_routing_capture")
            state.capture_on = True


async def pause_keeping_requests(engine: Any) -> None:
    """`engine.pause_generation(mode="keep")` without the 20 ms sleep vLLM ends it with.

    vLLM (0.26 to 0.32) sleeps 20 ms after pausing so that finishing requests' last outputs
    reach their callers first, "not required for correctness" by its own comment; in keep mode
    no request finishes; on the demo's model it was a large share of the update
    (docs/benchmarks.md). The two calls are pause_generation's own (multi-modal cache, then the
    scheduler pause that also drops the KV cache, so kept requests recompute it under the new
    weights).
    """
    await engine.renderer.clear_mm_cache_async()
    await engine.engine_core.pause_scheduler_async(mode="keep", clear_cache=True)


async def reset_prefix_cache_or_warn(engine: Any) -> None:
    """Drop cached prefixes after an update; say so when vLLM keeps them (it refuses while
    requests run), since a prefix cached under the old weights would then be reused."""
    try:
        reset = await engine.reset_prefix_cache()
    except Exception:
        log.warning("prefix cache reset failed", exc_info=True)
        return
    if reset is False:
        log.warning("prefix cache kept while requests run: old-weight prefixes may be reused")


async def unless_engine_dies(engine: Any, call: Any, poll_s: float = 1.0) -> Any:
    """Await `call` (an engine RPC), or raise RuntimeError once the engine is dead: vLLM's
    RPCs may never return when a worker died (a killed worker in a broadcast update), and the
    request they hang would keep this server from shutting down to be relaunched."""
    task = asyncio.ensure_future(call)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if getattr(engine, "errored", False):
            task.cancel()
            raise RuntimeError("the engine died during the update")


async def load_on_workers(
    request: Request,
    method: str,
    args: tuple,
    version: int | None,
    phases: dict[str, float] | None = None,
) -> JSONResponse:
    """Pause in keep mode, run the worker extension's `method` (a verified load) on every
    worker, bump the policy version and resume. A worker that refuses (its fingerprint check
    failed, or the broadcast did not reach it) makes this a 422 naming it; when every worker
    refused, the server keeps its weights and version. Anything else that fails is a 500. The
    response's `server_seconds` splits the server's time: `phases` (what the caller timed before:
    the record's checks) then pause, workers (receive, verify, reload: `worker_seconds`) and
    resume."""
    state: PolicyState = request.app.state.rlkit
    engine = request.app.state.engine_client
    clock = PhaseClock(phases)
    async with state.lock:
        state.updating = True
        was_paused = state.paused
        try:
            if not was_paused:
                await pause_keeping_requests(engine)
            clock.lap("pause")
            results = await unless_engine_dies(engine, engine.collective_rpc(method, args=args))
            clock.lap("workers")
            refused = [(i, r["error"]) for i, r in enumerate(results) if "error" in r]
            if refused:
                i, error = refused[0]
                log.error("weight update refused by worker %d: %s", i, error)
                kept = (
                    f"nothing was loaded, the server keeps policy version {state.version}"
                    if len(refused) == len(results)
                    else "the other workers loaded theirs: the weights are mixed until the "
                    "next update"
                )
                raise ServiceError(
                    422, f"weight update refused by worker {i} of {len(results)}: {error}; {kept}"
                )
            state.version = version if version is not None else state.version + 1
            if was_paused:  # our own pause dropped the cache already; another's may not have
                await reset_prefix_cache_or_warn(engine)
        except ServiceError:
            raise
        except Exception as exc:
            log.exception("weight update failed")
            raise ServiceError(500, f"weight update failed: {exc}") from exc
        finally:
            if not was_paused:
                try:  # a dead engine (it may not know yet) would hang this forever
                    await unless_engine_dies(engine, engine.resume_generation())
                except RuntimeError:
                    log.error("not resumed: the engine died during the update")
            clock.lap("resume")
            state.updating = False
    verified = all(r["verified"] for r in results)
    seconds = results[0].get("seconds")  # worker 0's receive / verify / load split
    return JSONResponse(
        {
            "policy_version": state.version,
            "verified": verified,
            "worker_seconds": seconds,
            "server_seconds": clock.phases,
        }
    )


class PhaseClock:
    """Seconds of an update's phases on the server, each from the previous lap (the first
    from the clock's start), added to `phases` (the response's `server_seconds`)."""

    def __init__(self, phases: dict[str, float] | None = None) -> None:
        self.phases = phases if phases is not None else {}
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now


async def status(request: Request) -> dict[str, Any]:
    state: PolicyState = request.app.state.rlkit
    engine = request.app.state.engine_client
    return {
        "policy_version": state.version,
        "model": state.model,
        "paused": await engine.is_paused(),
        "updating": state.updating,
        "routing": state.routing,
        "adapters": visible_adapters(request, state.adapters),
        "workers": engine.vllm_config.parallel_config.world_size,
    }


async def routing(response_id: str, request: Request) -> JSONResponse:
    state: PolicyState = request.app.state.rlkit
    if state.routing != "capture":
        raise ServiceError(
            400, f"routing capture is off (start the server with {CAPTURE_ROUTING_FLAG})"
        )
    if not owns_response(caller(request), response_id):  # as if there were none
        raise ServiceError(404, f"no routing for {response_id}")
    engine = request.app.state.engine_client
    found = await engine.collective_rpc("rlkit_take_routing", args=(response_id,))
    npy = next((r for r in found if r is not None), None)
    if npy is None:
        raise ServiceError(404, f"no routing for {response_id}")
    return JSONResponse({"routed_experts": base64.b64encode(npy).decode("ascii")})


def signed_record(path: str, token: str) -> PublishedVersion:
    """The version record published in `path`, signed with `token` (400 unreadable or missing,
    403 signed by anyone else: only the run's own trainer publishes versions)."""
    try:
        record = PublishedVersion.read(path)
    except (OSError, ValueError) as exc:
        raise ServiceError(400, f"unreadable version record: {exc}") from None
    if record is None:
        raise ServiceError(400, f"no published version record ({VERSION_FILE}) in {path}")
    if not record.signed_by(token):  # a copy anyone could have written, or altered
        raise ServiceError(
            403,
            f"the version record in {path} is not signed with this server's credential: only "
            "the run's own trainer publishes versions",
        )
    return record


async def update_weights(body: UpdateWeightsRequest, request: Request) -> JSONResponse:
    clock = PhaseClock()
    check_path(request, body.path)
    state: PolicyState = request.app.state.rlkit
    token = caller(request).token
    record = signed_record(body.path, token)
    if state.reference is not None:
        try:
            check_signature(record.shapes(), state.reference, body.path)
        except UsageError as exc:
            raise ServiceError(400, str(exc)) from None
    clock.lap("record")  # read, signature, shapes against the served checkpoint
    reception = Reception(
        rank=body.rank,
        timeout_s=security(request).max_update_s,
        secret=rendezvous_secret(token),
        digest_key=digest_key(token).hex(),
    )
    args = (
        record.model_dump_json(),
        str(body.path),
        json.dumps(asdict(reception)),
    )
    return await load_on_workers(request, "rlkit_update", args, body.version, clock.phases)


async def load_adapter(body: LoadAdapterRequest, request: Request) -> JSONResponse:
    claim_adapter(request, body.name, body.path)
    state: PolicyState = request.app.state.rlkit
    models = getattr(request.app.state, "openai_serving_models", None)
    if models is None or request.app.state.engine_client.vllm_config.lora_config is None:
        raise ServiceError(400, "LoRA is off on this server: start it with --enable-lora")
    try:
        check_adapter_dir(body.path)
    except UsageError as exc:
        raise ServiceError(400, str(exc)) from None
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

    load = LoadLoRAAdapterRequest(lora_name=body.name, lora_path=body.path, load_inplace=True)
    result = await models.load_lora_adapter(load)
    if not isinstance(result, str):  # vLLM's ErrorResponse
        raise ServiceError(result.error.code, result.error.message)
    state.adapters[body.name] = body.version
    return JSONResponse({"name": body.name, "policy_version": body.version})


async def unload_adapter(body: UnloadAdapterRequest, request: Request) -> JSONResponse:
    check_adapter_owner(request, body.name)
    state: PolicyState = request.app.state.rlkit
    models = getattr(request.app.state, "openai_serving_models", None)
    loaded = None if models is None else models.lora_requests.get(body.name)
    if loaded is None:
        raise no_adapter(body.name)
    from vllm.entrypoints.serve.lora.protocol import UnloadLoRAAdapterRequest

    await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=body.name))
    # vLLM's unload forgets the name only; the engine keeps the weights in a slot until
    # evicted, so free it now for the next run's adapter
    await request.app.state.engine_client.remove_lora(loaded.lora_int_id)
    state.adapters.pop(body.name, None)
    release_adapter(request, body.name)
    return JSONResponse({"name": body.name})


async def pause(request: Request, mode: str = "keep") -> JSONResponse:
    """vLLM's development-mode `/pause`, behind the owner's token: `keep` freezes in-flight
    requests (they go on after `/rlkit/resume`), `abort` and `wait` as vLLM's."""
    engine = request.app.state.engine_client
    state: PolicyState = request.app.state.rlkit
    if mode == "keep":
        await pause_keeping_requests(engine)
    elif mode in ("abort", "wait"):
        await engine.pause_generation(mode=mode)
    else:
        raise ServiceError(400, f"mode {mode!r}: keep, abort or wait")
    state.paused = True
    return JSONResponse({"paused": True})


async def resume(request: Request) -> JSONResponse:
    state: PolicyState = request.app.state.rlkit
    await request.app.state.engine_client.resume_generation()
    state.paused = False
    return JSONResponse({"paused": False})


PREFIX = "/rlkit"
# rlkit's routes, each with its rule: owner-only ones change the engine for every run on it
ROUTES = (
    Endpoint("GET", "/status", status),
    Endpoint("GET", "/routing/{response_id}", routing),
    Endpoint("POST", "/update_weights", update_weights, owner_only=True),
    Endpoint("POST", "/load_adapter", load_adapter),
    Endpoint("POST", "/unload_adapter", unload_adapter),
    Endpoint("POST", "/pause", pause, owner_only=True),
    Endpoint("POST", "/resume", resume, owner_only=True),
)
OWNER_PATHS = owner_paths(ROUTES, PREFIX)


def build_router() -> APIRouter:
    """`ROUTES` under `PREFIX` (the token check reads the same table: `OWNER_PATHS`)."""
    router = APIRouter(prefix=PREFIX)
    for endpoint in ROUTES:
        router.add_api_route(endpoint.path, endpoint.handler, methods=[endpoint.method])
    return router
