"""`rlkit sandbox check`: probe, from inside a real sandbox, what is isolated on this machine.

Each probe runs adversarially (try to read, connect, see, allocate) and the host judges the
answers; nothing is taken from configuration alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel

from rlkit.sandbox import rootfs
from rlkit.sandbox.runner import active_backend, limits, run

# The probe's own run: long enough for a loaded machine, the memory a small program needs.
PROBE_TIMEOUT = 20
PROBE_MEMORY_MB = 256
PROBE = """
import json, os, resource, socket
def visible(path):
    return os.path.exists(path)
out = {"uid": os.getuid(), "host_paths": {p: visible(p) for p in PATHS}}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    out["network"] = "connected"
except OSError as exc:
    out["network"] = type(exc).__name__
out["interfaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
out["pids"] = [p for p in os.listdir("/proc") if p.isdigit()]
out["rlimit_as"] = resource.getrlimit(resource.RLIMIT_AS)[0]
out["rlimit_nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
try:
    open("/usr/bin/rlkit-probe", "w").close()
    os.remove("/usr/bin/rlkit-probe")  # under the local backend this was the host's /usr/bin
    out["system_writable"] = True
except OSError:
    out["system_writable"] = False
print(json.dumps(out))
"""


class Finding(BaseModel):
    """One isolation property and whether it holds here."""

    name: str
    ok: bool
    detail: str


def cgroup_v2_memory() -> str | None:
    """The cgroup v2 directory rlkit could create per-sandbox memory cgroups in, or None.

    Needs the unified hierarchy at /sys/fs/cgroup with the memory controller enabled for our
    own cgroup's children, and write access to that cgroup (delegation).
    """
    root = Path("/sys/fs/cgroup")
    if not (root / "cgroup.controllers").exists():
        return None  # legacy or hybrid (cgroup v1) layout: memory is not on the v2 hierarchy
    own = Path(open("/proc/self/cgroup").read().strip().split("::", 1)[-1].lstrip("/"))
    cgroup = root / own
    controllers = (cgroup / "cgroup.subtree_control").read_text().split()
    if "memory" not in controllers or not os.access(cgroup, os.W_OK):
        return None
    return str(cgroup)


def _host_paths() -> list[str]:
    python = rootfs.sandbox_python()
    return sorted(
        {
            *rootfs.hidden_paths(python),
            os.getcwd(),
            str(Path.home()),
            "/etc/passwd",
            "/usr/local",
            "/usr/share",
            "/opt",
            "/home",
        }
    )


async def check() -> list[Finding]:
    """Run the probe in the sandbox (fails with SandboxUnavailable when it cannot isolate)."""
    backend = active_backend()
    paths = _host_paths()
    result = await run(
        f"PATHS = {paths!r}\n{PROBE}", timeout=PROBE_TIMEOUT, memory_mb=PROBE_MEMORY_MB
    )
    if result.status != "ok":
        return [Finding(name="sandbox starts", ok=False, detail=result.stderr.strip()[-500:])]
    seen = json.loads(result.stdout)
    visible = [p for p, v in seen["host_paths"].items() if v]
    run_limits = limits(PROBE_TIMEOUT, PROBE_MEMORY_MB)  # what the probe ran under
    cgroup = cgroup_v2_memory()
    return [
        Finding(
            name="backend",
            ok=backend.isolated,
            detail=backend.name if backend.isolated else f"{backend.name} (NOT isolated)",
        ),
        Finding(
            name="filesystem",
            ok=not visible and not seen["system_writable"],
            detail=(
                f"hidden: {', '.join(p for p in paths if p not in visible)}; "
                f"visible: {', '.join(visible) or 'none'}; read-only system: "
                f"{not seen['system_writable']}"
            ),
        ),
        Finding(
            name="network",
            ok=seen["network"] != "connected" and seen["interfaces"] in ([], ["lo"]),
            detail=f"connect to 1.1.1.1:53 -> {seen['network']}; interfaces: {seen['interfaces']}",
        ),
        Finding(
            name="processes",
            ok=len(seen["pids"]) <= 3,
            detail=f"{len(seen['pids'])} processes visible in /proc (the sandbox's own)",
        ),
        Finding(
            name="user",
            ok=seen["uid"] != 0,
            detail=f"programs run as uid {seen['uid']} inside a private user namespace",
        ),
        Finding(
            name="memory",
            ok=seen["rlimit_as"] == run_limits.memory_mb << 20
            and seen["rlimit_nproc"] == run_limits.nproc,
            detail=(
                f"total cap by accounting: {run_limits.nproc - 1} processes x "
                f"{run_limits.memory_mb} MiB (RLIMIT_AS) <= {run_limits.total_memory_mb} MiB; "
                + (
                    f"a cgroup v2 memory controller is delegated at {cgroup} (not used yet)"
                    if cgroup
                    else "no delegated cgroup v2 memory controller on this machine"
                )
            ),
        ),
    ]
