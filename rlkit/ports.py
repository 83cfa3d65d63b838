"""Default ports of rlkit's servers, in one place so that no two servers default to the same one
(running `rlkit infer` and `rlkit hub serve` side by side must work without flags)."""

INFERENCE_PORT = 8000  # `rlkit infer` (vLLM's own default; `rlkit eval -b` expects it)
HUB_PORT = 8080  # `rlkit hub serve`
SANDBOX_PORT = 8790  # `rlkit sandbox serve`
