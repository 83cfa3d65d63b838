"""vLLM worker extension: load new policy weights in place, from HF safetensors on disk or
received over the trainer's broadcast group (`rlkit.inference.broadcast`), verified against the
trainer's fingerprint (`rlkit.inference.fingerprint`).

vLLM mixes this class into every worker (``--worker-extension-cls``); the API server reaches it
with ``engine.collective_rpc("rlkit_load_weights", args=(path, ...))``. The weights go through
vLLM's in-place reload, which handles fused layouts (qkv, gate/up, experts). Importing this
module (vLLM does it in every worker) also applies `RLKIT_VLLM_BUSY_LOOP_S` (see `polling`)
and makes the worker kill its process group (engine core included) once rlkit's API server is
gone (`rlkit.lifetime.follow_process`), so a killed server leaves no engine process behind.
"""

from __future__ import annotations

import os

import torch

from rlkit.inference.polling import apply_from_env
from rlkit.inference.weights import iter_safetensors
from rlkit.lifetime import SERVER_PID_ENV, follow_process

EXIT_IN_BROADCAST_ENV = "RLKIT_TEST_EXIT_IN_BROADCAST"  # "RANK:VERSION": die after one bucket

apply_from_env()
if os.environ.get(SERVER_PID_ENV, "").isdigit() and int(os.environ[SERVER_PID_ENV]) != os.getpid():
    follow_process(int(os.environ[SERVER_PID_ENV]))


def corrupted(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` with one element changed (the corruption test hook)."""
    out = tensor.clone()
    out.view(-1)[out.numel() // 2] += 1
    return out


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

    def rlkit_load_weights(self, path: str, corrupt_tensor: str | None = None) -> dict:
        """Load every tensor under `path` into the running model, verified first.

        The tensors are read into memory and, when the directory carries the trainer's
        fingerprint, checked against it before any reaches the model (`_verify_and_load`).
        `corrupt_tensor` is a test hook: that tensor is altered after it is read, as a fault in
        flight would. Returns {"tensors", "verified"} or {"error"}.
        """
        from rlkit.inference.fingerprint import read_fingerprint

        tensors = list(iter_safetensors(path))
        return self._verify_and_load(tensors, read_fingerprint(path), corrupt_tensor)

    def rlkit_receive_weights(
        self, path: str, first_rank: int, corrupt_tensor: str | None = None
    ) -> dict:
        """Join the broadcast update published in `path` as rank `first_rank` + this worker's
        rank, receive every bucket, then verify and load like `rlkit_load_weights`.

        The buckets are kept until the last one has arrived and the whole update matches the
        fingerprint: loading each bucket as it lands would leave the model half-updated when a
        later bucket fails or is corrupt, and the server must keep its old version then. The
        memory cost (one copy of the weights) is the filesystem path's too. A transfer that
        fails returns {"error"} naming the trainer, with the model untouched.
        """
        from rlkit.inference.broadcast import BroadcastError, read_manifest, receive
        from rlkit.inference.fingerprint import read_fingerprint

        manifest = read_manifest(path)
        if manifest is None:
            return {"error": f"no broadcast manifest in {path}"}
        rank = first_rank + getattr(self, "rank", 0)
        tensors: list[tuple[str, torch.Tensor]] = []
        exit_at = os.environ.get(EXIT_IN_BROADCAST_ENV)  # test hook: a server killed mid-way
        try:
            for bucket in receive(manifest, rank):
                tensors += bucket
                if exit_at == f"{rank}:{manifest['version']}":
                    os._exit(1)
        except BroadcastError as exc:
            return {"error": str(exc)}
        return self._verify_and_load(tensors, read_fingerprint(path), corrupt_tensor)

    def _verify_and_load(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        expected: dict | None,
        corrupt_tensor: str | None,
    ) -> dict:
        """Check `tensors` against the fingerprint (when there is one) before any reaches the
        model: a mismatch returns {"error": ...} with the model untouched. Then vLLM's in-place
        reload, which re-applies the backend's post-load weight processing (the CPU backend
        repacks linear weights after loading)."""
        from rlkit.inference.fingerprint import mismatches

        if corrupt_tensor is not None:
            tensors = [(n, corrupted(t) if n == corrupt_tensor else t) for n, t in tensors]
        if expected is not None and (problems := mismatches(tensors, expected)):
            return {"error": "; ".join(problems)}
        self.reload_weights(weights_iterator=iter(tensors))  # type: ignore[attr-defined]
        self._refresh_tied_lm_head()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"tensors": len(tensors), "verified": expected is not None}

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
