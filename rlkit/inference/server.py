"""The rlkit inference server: vLLM's OpenAI-compatible server plus rlkit's weight-sync routes.

Run as ``python -m rlkit.inference.server --model DIR --rlkit-token-file FILE [vLLM serve args]``
(what ``rlkit infer`` launches). Every route but ``/health`` needs the owner's or a tenant's
token (`rlkit.inference.auth`); vLLM's development routes are off. On top of vLLM's API (chat,
completions) it adds rlkit's routes (`rlkit.inference.routes`, one handler each):

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
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from rlkit.errors import UsageError
from rlkit.inference.auth import install_auth
from rlkit.inference.routes import PolicyState, build_router, ensure_capture
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.inference.temp_dirs import remove_own_temp_dir
from rlkit.inference.tenancy import DEFAULT_MAX_UPDATE_S, ServerSecurity
from rlkit.inference.weights import weight_signature
from rlkit.lifetime import SERVER_PID_ENV
from rlkit.protocol.credentials import TOKEN_FILE_ENV, read_token
from rlkit.serving import load_tenants, scope_caller

log = logging.getLogger("rlkit.inference.server")

WORKER_EXTENSION = "rlkit.inference.worker_ext.WeightSyncExtension"


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
