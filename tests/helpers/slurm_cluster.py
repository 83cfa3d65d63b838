"""A private SLURM cluster on this machine for tests: munged, slurmctld and one slurmd per node.

Debian's `slurm-wlm` and `munge` run unmodified. Every daemon gets its own files under a temporary
directory (munge socket and key, slurm.conf, state, spool, logs) and free TCP ports, so nothing
of the host's configuration is read or changed and two test sessions never meet. Several slurmd
on one machine play several nodes (`NodeName=node[1-N]`, one port each). Client commands reach
it through `SLURM_CONF` (see `env`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from rlkit.inference import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
FIX = "Debian/Ubuntu: apt-get install slurm-wlm munge (scripts/setup.sh installs them)"


def available() -> bool:
    return all(shutil.which(tool) or Path("/usr/sbin", tool).exists() for tool in DAEMONS)


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """`nodes` fake nodes of `cpus` CPUs each; `start()`, then `env` for sbatch/scontrol."""

    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2) -> None:
        self.root = root
        self.nodes = nodes
        self.cpus = cpus
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _daemon(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}-{len(self.procs)}.out", "w")
        self.procs.append(
            subprocess.Popen(
                [_tool(name), *args], stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        )

    def _write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ports = [free_port() for _ in range(self.nodes + 1)]
        root = self.root
        nodes = "".join(
            f"NodeName=node{i} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports[i]} "
            f"CPUs={self.cpus} RealMemory=2000\n"
            for i in range(1, self.nodes + 1)
        )
        self.conf.write_text(
            f"""ClusterName=rlkittest
SlurmctldHost=localhost
SlurmctldPort={ports[0]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
{nodes}PartitionName=debug Nodes=node[1-{self.nodes}] Default=YES MaxTime=INFINITE State=UP \
OverSubscribe=FORCE
"""
        )

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self._write_config()
        munge = self.root / "munge"
        self._daemon(
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.socket}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            self._check(deadline, "munged")
        self._daemon("slurmctld", "-D", "-i")
        for i in range(1, self.nodes + 1):
            self._daemon("slurmd", "-D", "-N", f"node{i}")
        while self.idle_nodes() < self.nodes:
            self._check(deadline, "slurmctld/slurmd")
        return self

    def _check(self, deadline: float, what: str) -> None:
        dead = [p.args[0] for p in self.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(
                f"== {f.name}\n{f.read_text(errors='ignore')[-1500:]}"
                for f in sorted((self.root / "log").iterdir())
            )
            self.stop()
            raise RuntimeError(f"{what} did not start (exited: {dead}):\n{logs}")
        time.sleep(0.2)

    def idle_nodes(self) -> int:
        done = subprocess.run(
            [_tool("sinfo"), "-h", "-N", "-o", "%t"], env=self.env, capture_output=True, text=True
        )
        return done.stdout.split().count("idle") if done.returncode == 0 else 0

    def job_state(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, ...)."""
        done = subprocess.run(
            [_tool("scontrol"), "show", "job", job_id, "-o"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        fields = dict(item.split("=", 1) for item in done.stdout.split() if "=" in item)
        return fields

    def stop(self) -> None:
        subprocess.run([_tool("scancel"), "--full", "-u", "root"], env=self.env, check=False)
        time.sleep(1)
        for proc in reversed(self.procs):  # slurmd, slurmctld, then munged
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
