"""vLLM inference: server launch with weight sync and async clients. The orchestrator's server
pool (`rlkit.inference.pool`) is imported from its module: it brings the weight transports
(torch), which an environment process never needs."""

from rlkit.inference.client import Generation, InferenceClient, InferenceError
from rlkit.inference.lifecycle import ServerProcess, start_server
from rlkit.ports import free_port

__all__ = [
    "Generation",
    "InferenceClient",
    "InferenceError",
    "ServerProcess",
    "free_port",
    "start_server",
]
