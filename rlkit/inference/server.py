"""The rlkit inference server: vLLM's OpenAI-compatible server plus rlkit's weight-sync routes.

Run as ``python -m rlkit.inference.server --model DIR --rlkit-token-file FILE [vLLM serve args]``
(what ``rlkit infer`` launches). Every route but ``/health`` needs the owner's or a tenant's
token (`rlkit.inference.auth`); vLLM's development routes are off. On top of vLLM's API (chat,
completions) it adds:

- ``POST /rlkit/pause?mode=keep`` and ``POST /rlkit/resume`` (owner only): vLLM's
  development-mode pause (``keep`` freezes in-flight requests instead of aborting them);
- ``GET  /rlkit/status``          -> {"policy_version", "model", "paused", "updating",
  "workers", ...} (workers: how many ranks this server brings to a broadcast update)
- ``POST /rlkit/update_weights``  {"path": DIR, "version": N?, "rank": R?} ->
  {"policy_version", "verified"} loads the version the trainer published in DIR: its record
  (`rlkit.protocol.weights.PublishedVersion`) is read and checked against the served checkpoint
  (names, shapes: a bad one is a 400 and changes nothing), then generation pauses in ``keep``
  mode (in-flight requests are frozen, not aborted), every worker receives the tensors through
  the record's transport (`rlkit.weights`: files, a broadcast group it joins as rank R + its
  index, a shared buffer), checks them against the record's tensor table and loads them in
  place; the policy version is bumped and generation resumes. A worker that refuses (a tensor
  differs, the transfer failed: the trainer died or stalled past its timeout) makes this a 422
  naming it, and the server keeps its weights and version.
- ``POST /rlkit/load_adapter``    {"name", "path", "version"} -> {"name", "policy_version"}
  (servers started with ``--enable-lora``) loads a PEFT LoRA adapter under `name`, replacing
  the adapter of that name in place (vLLM's ``load_inplace``) without pausing anything else:
  requests name the adapter as their ``model``, and each run on a shared server has its own.
- ``POST /rlkit/unload_adapter``  {"name"} -> {"name"} forgets the adapter and frees its slot.
- ``GET  /rlkit/routing/{response_id}`` -> {"routed_experts": base64 .npy} (then forgotten)
  with ``--rlkit-capture-routing`` (a tenant gets its own responses' only, others are a 404 as
  for an unknown id): the experts each MoE layer chose for that completion's
  tokens, [tokens, moe_layers, top_k], recorded by the worker extension
  (`rlkit.inference.routing_capture`) for engines without vLLM's own
  ``--enable-return-routed-experts`` (the CPU build). Needs eager mode, which the flag sets.
- every response carries an ``X-Policy-Version`` header with the version at response time, so a
  client can tell which policy finished each request, and with adapters loaded an
  ``X-Adapter-Versions`` header (JSON {name: version}) with each adapter's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from rlkit.errors import UsageError
from rlkit.inference.auth import (
    DEFAULT_MAX_UPDATE_S,
    ServerSecurity,
    caller,
    check_adapter_owner,
    check_path,
    claim_adapter,
    install_auth,
    load_tenants,
    no_adapter,
    owns_response,
    release_adapter,
    scope_caller,
    security,
    visible_adapters,
)
from rlkit.inference.lifecycle import remove_own_temp_dir
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.inference.weights import check_adapter_dir, check_signature, weight_signature
from rlkit.lifetime import SERVER_PID_ENV
from rlkit.protocol.credentials import TOKEN_FILE_ENV, read_token, rendezvous_secret
from rlkit.protocol.weights import VERSION_FILE, PublishedVersion
from rlkit.weights.transport import Reception

log = logging.getLogger("rlkit.inference.server")

WORKER_EXTENSION = "rlkit.inference.worker_ext.WeightSyncExtension"


class UpdateWeightsRequest(BaseModel):
    path: str  # the published version's directory (its record, and files for `filesystem`)
    version: int | None = None
    rank: int = 0  # broadcast: this server's first worker's rank in the update's group
    corrupt_tensor: str | None = None  # test hook: alter this tensor after the worker gets it


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


class PolicyVersionHeader:
    """ASGI middleware adding ``X-Policy-Version`` to every HTTP response; with routing
    capture it also turns the capture on before the first request (``/health`` included)."""

    def __init__(self, app: Any, state: PolicyState, root: FastAPI) -> None:
        self.app = app
        self.state = state
        self.root = root

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.state.routing == "capture" and not self.state.capture_on:
            await ensure_capture(self.state, self.root.state.engine_client)

        async def send_with_version(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-policy-version", str(self.state.version).encode()))
                seen = self.root.state.rlkit_security.visible(
                    scope_caller(scope), self.state.adapters
                )
                if seen:
                    versions = json.dumps(seen, separators=(",", ":"))
                    headers.append((b"x-adapter-versions", versions.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_version)


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
    request: Request, method: str, args: tuple, version: int | None
) -> JSONResponse:
    """Pause in keep mode, run the worker extension's `method` (a verified load) on every
    worker, bump the policy version and resume. A worker that refuses (its fingerprint check
    failed, or the broadcast did not reach it) makes this a 422 naming it; when every worker
    refused, the server keeps its weights and version."""
    state: PolicyState = request.app.state.rlkit
    engine = request.app.state.engine_client
    async with state.lock:
        state.updating = True
        was_paused = await engine.is_paused()
        try:
            if not was_paused:
                await pause_keeping_requests(engine)
            results = await unless_engine_dies(engine, engine.collective_rpc(method, args=args))
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
                return JSONResponse(
                    {
                        "error": f"weight update refused by worker {i} of {len(results)}: "
                        f"{error}; {kept}"
                    },
                    status_code=422,
                )
            state.version = version if version is not None else state.version + 1
            if was_paused:  # our own pause dropped the cache already; another's may not have
                await reset_prefix_cache_or_warn(engine)
        except Exception as exc:
            log.exception("weight update failed")
            return JSONResponse({"error": f"weight update failed: {exc}"}, status_code=500)
        finally:
            if not was_paused:
                try:  # a dead engine (it may not know yet) would hang this forever
                    await unless_engine_dies(engine, engine.resume_generation())
                except RuntimeError:
                    log.error("not resumed: the engine died during the update")
            state.updating = False
    verified = all(r["verified"] for r in results)
    seconds = results[0].get("seconds")  # worker 0's receive / verify / load split
    return JSONResponse(
        {"policy_version": state.version, "verified": verified, "worker_seconds": seconds}
    )


def build_router() -> APIRouter:
    router = APIRouter(prefix="/rlkit")

    @router.get("/status")
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

    @router.get("/routing/{response_id}")
    async def routing(response_id: str, request: Request) -> JSONResponse:
        state: PolicyState = request.app.state.rlkit
        if state.routing != "capture":
            return JSONResponse(
                {"error": f"routing capture is off (start the server with {CAPTURE_ROUTING_FLAG})"},
                status_code=400,
            )
        if not owns_response(caller(request), response_id):  # as if there were none
            return JSONResponse({"error": f"no routing for {response_id}"}, status_code=404)
        engine = request.app.state.engine_client
        found = await engine.collective_rpc("rlkit_take_routing", args=(response_id,))
        npy = next((r for r in found if r is not None), None)
        if npy is None:
            return JSONResponse({"error": f"no routing for {response_id}"}, status_code=404)
        return JSONResponse({"routed_experts": base64.b64encode(npy).decode("ascii")})

    @router.post("/update_weights")
    async def update_weights(body: UpdateWeightsRequest, request: Request) -> JSONResponse:
        check_path(request, body.path)
        state: PolicyState = request.app.state.rlkit
        try:
            record = PublishedVersion.read(body.path)
        except (OSError, ValueError) as exc:
            return JSONResponse({"error": f"unreadable version record: {exc}"}, status_code=400)
        if record is None:
            return JSONResponse(
                {"error": f"no published version record ({VERSION_FILE}) in {body.path}"},
                status_code=400,
            )
        token = caller(request).token
        if not record.signed_by(token):  # a copy anyone could have written, or altered
            return JSONResponse(
                {
                    "error": f"the version record in {body.path} is not signed with this "
                    "server's credential: only the run's own trainer publishes versions"
                },
                status_code=403,
            )
        if state.reference is not None:
            try:
                check_signature(record.shapes(), state.reference, body.path)
            except UsageError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
        reception = Reception(
            rank=body.rank,
            timeout_s=security(request).max_update_s,
            secret=rendezvous_secret(token),
        )
        args = (
            record.model_dump_json(),
            str(body.path),
            json.dumps(asdict(reception)),
            body.corrupt_tensor,
        )
        return await load_on_workers(request, "rlkit_update", args, body.version)

    @router.post("/load_adapter")
    async def load_adapter(body: LoadAdapterRequest, request: Request) -> JSONResponse:
        claim_adapter(request, body.name, body.path)
        state: PolicyState = request.app.state.rlkit
        models = getattr(request.app.state, "openai_serving_models", None)
        if models is None or request.app.state.engine_client.vllm_config.lora_config is None:
            return JSONResponse(
                {"error": "LoRA is off on this server: start it with --enable-lora"},
                status_code=400,
            )
        try:
            check_adapter_dir(body.path)
        except UsageError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        load = LoadLoRAAdapterRequest(lora_name=body.name, lora_path=body.path, load_inplace=True)
        result = await models.load_lora_adapter(load)
        if not isinstance(result, str):  # vLLM's ErrorResponse
            return JSONResponse({"error": result.error.message}, status_code=result.error.code)
        state.adapters[body.name] = body.version
        return JSONResponse({"name": body.name, "policy_version": body.version})

    @router.post("/unload_adapter")
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

    @router.post("/pause")
    async def pause(request: Request, mode: str = "keep") -> JSONResponse:
        """vLLM's development-mode `/pause`, behind the owner's token: `keep` freezes
        in-flight requests (they go on after `/rlkit/resume`), `abort` and `wait` as vLLM's."""
        engine = request.app.state.engine_client
        if mode == "keep":
            await pause_keeping_requests(engine)
        elif mode in ("abort", "wait"):
            await engine.pause_generation(mode=mode)
        else:
            return JSONResponse({"error": f"mode {mode!r}: keep, abort or wait"}, status_code=400)
        return JSONResponse({"paused": True})

    @router.post("/resume")
    async def resume(request: Request) -> JSONResponse:
        await request.app.state.engine_client.resume_generation()
        return JSONResponse({"paused": False})

    return router


def install(app: FastAPI, model: str, security: ServerSecurity, routing: str | None = None) -> None:
    """Attach rlkit's routes, the policy-version header and the token check (outermost) to
    vLLM's FastAPI app."""
    reference = None
    if Path(model).is_dir():
        reference = weight_signature(model)
    app.state.rlkit = PolicyState(model, reference, routing)
    app.include_router(build_router())

    app.middleware_stack = None  # vLLM built it already; Starlette rebuilds it on first call
    app.add_middleware(PolicyVersionHeader, state=app.state.rlkit, root=app)
    install_auth(app, security)


def rlkit_arg_parser() -> argparse.ArgumentParser:
    """rlkit's own server flags (taken out of argv before vLLM parses the rest)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--rlkit-token-file",
        default=os.environ.get(TOKEN_FILE_ENV),
        help=f"the owner's token file (default ${TOKEN_FILE_ENV}); required",
    )
    parser.add_argument(
        "--rlkit-tenants-dir", help="one NAME.token file per run sharing this server"
    )
    parser.add_argument(
        "--rlkit-allowed-weights-root",
        action="append",
        default=[],
        help="a directory weights and adapters may be loaded from (repeatable)",
    )
    parser.add_argument(
        "--rlkit-max-update-s",
        type=float,
        default=DEFAULT_MAX_UPDATE_S,
        help="the longest any weight update may keep generation paused",
    )
    return parser


def server_security(argv: list[str]) -> tuple[ServerSecurity, list[str]]:
    """The credentials and limits rlkit's flags in `argv` name, and the flags left for vLLM.
    No token file is an error: this server never runs open."""
    ours, rest = rlkit_arg_parser().parse_known_args(argv)
    if not ours.rlkit_token_file:
        raise UsageError(
            f"no token file: pass --rlkit-token-file FILE or set {TOKEN_FILE_ENV} "
            "(`rlkit infer` creates one)"
        )
    if any(a == "--api-key" or a.startswith("--api-key=") for a in rest):
        raise UsageError(
            "--api-key: rlkit's server token protects every route, OpenAI's included; "
            "clients send it as their API key"
        )
    security = ServerSecurity(
        owner_token=read_token(ours.rlkit_token_file),
        tenants=load_tenants(ours.rlkit_tenants_dir),
        roots=[Path(r) for r in ours.rlkit_allowed_weights_root],
        max_update_s=ours.rlkit_max_update_s,
    )
    return security, rest


def vllm_serve_modules() -> tuple[Any, Any]:
    """vLLM's serve argument module and the module whose `build_app` and `run_server` start the
    server: `vllm.entrypoints.launchers` since 0.31, the OpenAI server's own modules before
    (0.26 is the release built for torch 2.11, which many GPU images carry)."""
    try:
        from vllm.entrypoints.launchers import cli_args
        from vllm.entrypoints.launchers.api_server import entry
    except ImportError:
        from vllm.entrypoints.openai import api_server as entry
        from vllm.entrypoints.openai import cli_args
    return cli_args, entry


def fork_engine_processes_on_cpu(user_method: str | None) -> None:
    """On CPU, with `VLLM_WORKER_MULTIPROC_METHOD=fork` in the user's environment, start vLLM's
    engine process (and a worker process, where it has one) by fork (opt-in; spawn stays the
    default).

    vLLM's CPU platform replaces any method by spawn while it configures the engine, so the
    engine process (and a worker process) starts a fresh interpreter and imports vLLM and torch
    again: most of a tiny model's engine start on the 2-core machine (`tests/benchmarks/
    bench_inference.py --start-methods uni,spawn,fork`). Forked, they start before any of them
    runs an OpenMP region (the worker binds its threads after the fork). Not the default: some runs
    with forked engines learned less than spawned ones (docs/benchmarks.md, cause not found).
    `user_method` is what the user's environment named before vLLM's CLI set its own.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or user_method != "fork":
        return
    platform = type(current_platform)
    configure = platform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        configure(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    platform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign]


def worker_in_engine_process_on_cpu() -> None:
    """On CPU, run vLLM's worker inside its engine process (the `uni` executor) unless the
    user's environment sets `VLLM_ENABLE_V1_MULTIPROCESSING`.

    vLLM's CPU platform asks for a worker process of its own ("OMP requires the MP executor"):
    a fresh interpreter started after vLLM has named its OpenMP library (and an allocator, where
    it bundles one) in `LD_PRELOAD`. The API server starts the engine process that way too
    (AsyncLLM always runs the engine in a process of its own), so a worker inside it gets the
    same libraries, and each engine start imports vLLM and torch in one process fewer
    (`tests/benchmarks/bench_inference.py --start-methods uni,spawn`). A tensor-parallel engine
    keeps one process per worker.
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main(argv: list[str] | None = None) -> None:
    """Start vLLM's server with rlkit's extension and routes."""
    # no unauthenticated development routes (/collective_rpc, /pause, /sleep...), and no
    # runtime LoRA loading but rlkit's tenant-aware /rlkit/load_adapter
    os.environ["VLLM_SERVER_DEV_MODE"] = "0"
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "0"
    os.environ.pop("VLLM_API_KEY", None)  # vLLM's own key (OpenAI routes only): the token rules
    user_start_method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
    import uvloop
    import vllm.logger
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_args, entry = vllm_serve_modules()

    cli_env_setup()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        security, argv = server_security(argv)
    except UsageError as exc:
        sys.exit(f"rlkit inference server: {exc}")
    capture = CAPTURE_ROUTING_FLAG in argv
    argv = [a for a in argv if a != CAPTURE_ROUTING_FLAG]
    parser = cli_args.make_arg_parser(FlexibleArgumentParser(description="rlkit inference server"))
    args = parser.parse_args(argv)
    routing = None
    if capture:  # the capture hooks run in Python: no compiled graph, no skipped prefixes
        args.enforce_eager = True
        args.enable_prefix_caching = False
        routing = "capture"
    elif getattr(args, "enable_return_routed_experts", False):
        routing = "vllm"
    os.environ[SERVER_PID_ENV] = str(os.getpid())  # engine processes follow us (rlkit.lifetime)
    configure_logging = getattr(vllm.logger, "configure_logging_from_args", None)
    if configure_logging is not None:  # vLLM >= 0.31; older releases read VLLM_LOGGING_* only
        configure_logging(args)
    if not args.worker_extension_cls:
        args.worker_extension_cls = WORKER_EXTENSION
    cli_args.validate_parsed_serve_args(args)

    original_build_app = entry.build_app

    def build_app(*a: Any, **kw: Any) -> FastAPI:
        app = original_build_app(*a, **kw)
        install(app, args.model, security, routing)
        return app

    entry.build_app = build_app
    fork_engine_processes_on_cpu(user_start_method)
    worker_in_engine_process_on_cpu()
    try:
        uvloop.run(entry.run_server(args))
    finally:
        remove_own_temp_dir()


if __name__ == "__main__":
    main(sys.argv[1:])
