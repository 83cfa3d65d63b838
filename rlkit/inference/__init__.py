"""vLLM inference: server launch with weight sync, async clients, a server pool."""

from rlkit.inference.client import Generation, InferenceClient, InferenceError
from rlkit.inference.lifecycle import ServerProcess, free_port, start_server
from rlkit.inference.pool import ClientPool

__all__ = [
    "ClientPool",
    "Generation",
    "InferenceClient",
    "InferenceError",
    "ServerProcess",
    "free_port",
    "start_server",
]
