"""Ports of rlkit's servers: their defaults, in one place so that no two servers default to the
same one (running `rlkit infer` and `rlkit hub serve` side by side must work without flags), and
whether one is free."""

import socket

from rlkit.errors import UsageError

INFERENCE_PORT = 8000  # `rlkit infer` (vLLM's own default; `rlkit eval -b` expects it)
HUB_PORT = 8080  # `rlkit hub serve`
SANDBOX_PORT = 8790  # `rlkit sandbox serve`


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Raise UsageError if something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UsageError(f"port {port} on {host} is already in use ({exc.strerror})") from exc
