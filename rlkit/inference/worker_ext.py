"""vLLM worker extension: load a published policy version in place, received through its
transport (`rlkit.weights`: files, a broadcast group, a shared buffer) and checked against the
version's tensor table (`rlkit.protocol.weights`).

vLLM mixes this class into every worker (``--worker-extension-cls``); the API server reaches it
with ``engine.collective_rpc("rlkit_update", args=(record_json, ...))``. The weights go through
vLLM's in-place reload, which handles fused layouts (qkv, gate/up, experts). Importing this
module (vLLM does it in every worker) also applies `RLKIT_VLLM_BUSY_LOOP_S` (see `polling`)
and makes the worker kill its process group (engine core included) once rlkit's API server is
gone (`rlkit.lifetime.follow_process`), so a killed server leaves no engine process behind,
and asks Linux for the CPU's AMX tile state (`allow_amx`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from rlkit.inference.polling import apply_from_env
from rlkit.lifetime import SERVER_PID_ENV, follow_process


def allow_amx() -> None:
    """Ask the kernel for AMX tile state where the CPU has it: Linux grants it to a process only
    on request, and vLLM's CPU attention uses AMX tiles on such CPUs while only torch.compile's
    ISA probe asks for them, so an eager engine died of SIGILL at its first request."""
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()


apply_from_env()
allow_amx()
if os.environ.get(SERVER_PID_ENV, "").isdigit() and int(os.environ[SERVER_PID_ENV]) != os.getpid():
    follow_process(int(os.environ[SERVER_PID_ENV]))


class WeightSyncExtension:
    """Methods callable on each vLLM worker through ``collective_rpc``."""

    def rlkit_enable_routing_capture(self) -> bool:
        """Start recording each request's routed experts (R3 without vLLM's V2 runner)."""
        from rlkit.inference.routing_capture import RoutingCapture

        if getattr(self, "_rlkit_routing", None) is None:
            self._rlkit_routing = RoutingCapture(self.model_runner)  # type: ignore[attr-defined]
        return True

    def rlkit_take_routing(self, prefix: str) -> bytes | None:
        """The recorded routing of request `prefix` as `.npy` bytes (then forgotten), or None."""
        import io

        import numpy as np

        capture = getattr(self, "_rlkit_routing", None)
        routing = None if capture is None else capture.take(prefix)
        if routing is None:
            return None
        with io.BytesIO() as buffer:
            np.save(buffer, routing, allow_pickle=False)
            return buffer.getvalue()

    def rlkit_update(self, record_json: str, directory: str, reception_json: str) -> dict:
        """Receive the version `record_json` describes through its transport (`rlkit.weights`;
        `reception_json`: the server's `Reception`, where this worker's rank in a broadcast
        group is its rank + this worker's own, and the key of the table's tags), check every
        tensor against the record's table before any reaches the model, then load them in
        place.

        The record comes from the API server, which verified its signature: the worker does not
        re-read it from `directory`, where it could have changed since. Returns
        {"tensors", "verified", "seconds": {receive, verify, load}} or {"error"}, with the model
        untouched on an error.
        """
        from rlkit.protocol.weights import Digester, PublishedVersion, mismatches
        from rlkit.weights import Reception, transport_class

        record = PublishedVersion.model_validate_json(record_json)
        reception = Reception(**json.loads(reception_json))
        key = bytes.fromhex(reception.digest_key)
        if len(key) != 32:
            return {"error": "no key for the tensor table's tags (32 bytes expected)"}
        # the record's nonce: a transport may hand it tensors as they arrive
        with Digester(key, record.nonce) as digester:
            reception = replace(
                reception, rank=reception.rank + getattr(self, "rank", 0), digester=digester
            )
            try:
                transport = transport_class(record.transport)
                t0 = time.perf_counter()
                tensors = transport.receive(record, Path(directory), reception)
            except (RuntimeError, OSError, ValueError) as exc:
                return {"error": str(exc)}
            t1 = time.perf_counter()
            if problems := mismatches(tensors, record, digester):
                return {"error": "; ".join(problems)}
        t2 = time.perf_counter()
        self.reload_weights(weights_iterator=iter(tensors))  # type: ignore[attr-defined]
        self._refresh_tied_lm_head()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = {"receive": t1 - t0, "verify": t2 - t1, "load": time.perf_counter() - t2}
        return {"tensors": len(tensors), "verified": True, "seconds": seconds}

    def _refresh_tied_lm_head(self) -> None:
        """Re-run the LM head's post-load processing when it shares the embedding weight.

        With tied embeddings the checkpoint has no ``lm_head.weight``, so vLLM's reload never
        re-processes the head; on CPU that leaves a stale prepacked (oneDNN) copy in use.
        """
        model = self.model_runner.model  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is None or embed is None or head.weight is not embed.weight:
            return
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
