"""Start, wait for and stop inference servers as child processes (used by tests and
`rlkit train`).

A server is a `rlkit.lifetime.ChildProcess`: stopped by its own process group id, never by
name; its output goes to a log file whose tail is included in any start-up error.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.inference.client import InferenceClient
from rlkit.inference.engine_args import (
    check_model_dir,
    security_args,
    server_command,
    server_env,
)
from rlkit.inference.temp_dirs import RPC_DIR_OWNER, server_temp_dir
from rlkit.lifetime import ChildProcess
from rlkit.ports import check_port_free, free_port
from rlkit.protocol.credentials import TOKEN_FILE_ENV, ensure_token_file, read_token


@dataclass(kw_only=True)
class ServerProcess(ChildProcess):
    """A running inference server subprocess."""

    url: str
    token_file: Path
    rpc_dir: Path | None = field(default=None, repr=False)  # its `server_temp_dir`
    what = "inference server"

    @property
    def token(self) -> str:
        """The owner's token of this server (what every client of it sends)."""
        return read_token(self.token_file)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, **kwargs: object) -> InferenceClient:
        """An `InferenceClient` of this server holding its owner's token."""
        return InferenceClient(self.url, api_key=self.token, **kwargs)  # type: ignore[arg-type]

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until /health answers 200; raise RuntimeError with the log tail otherwise."""
        self.wait_healthy(f"{self.url}/health", timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server's whole process group and remove what a killed engine could not."""
        super().stop(timeout)
        if self.rpc_dir is not None:
            shutil.rmtree(self.rpc_dir, ignore_errors=True)


def start_server(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: str | Path | None = None,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    token_file: str | Path | None = None,
    weights_roots: list[str | Path] | tuple = (),
    tenants_dir: str | Path | None = None,
    max_update_s: float | None = None,
) -> ServerProcess:
    """Launch a server in its own process group; call `.wait_ready()` then use `.url` with the
    token in `token_file` (when not given: the run's, `$RLKIT_TOKEN_FILE`, else one created
    0600 beside the log: `.token_file`).
    Weights and adapters load from `weights_roots` only."""
    check_model_dir(model)
    if port is None:
        port = free_port(host)
    else:
        check_port_free(host, port)
    log_path = Path(log_path) if log_path else Path(f"vllm-{port}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)  # the token file may go beside it
    # a run's own process starting a server hands it the run's credential
    token_file = Path(
        token_file or os.environ.get(TOKEN_FILE_ENV) or log_path.with_suffix(".token")
    )
    ensure_token_file(token_file)
    security = security_args(weights_roots, tenants_dir, max_update_s)
    server_vars = {**server_env(), **(env or {}), TOKEN_FILE_ENV: str(token_file.resolve())}
    rpc_dir = server_temp_dir(server_vars)
    argv = server_command(model, host, port, [*security, *(extra_args or [])])
    proc, log_file = ChildProcess.launch(argv, log_path, server_vars)
    (rpc_dir / RPC_DIR_OWNER).write_text(str(proc.pid))
    return ServerProcess(
        process=proc,
        url=f"http://{host}:{port}",
        log_path=log_path,
        token_file=token_file,
        _log_file=log_file,
        rpc_dir=rpc_dir,
    )
