"""What of the host filesystem a sandbox sees: an allowlist, never all of /usr.

Only the interpreter, its standard library (with any site-packages inside it hidden), the
executables in /usr/bin and the shared libraries they load are bound, read-only. Site-packages,
dist-packages, /usr/local, /usr/share, /opt, the checkout and every installed environment's data
stay invisible, even when rlkit and its environments are installed into the system Python, so a
program under test cannot read the graders' expected outputs.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

# Shared-library directories (Debian multiarch and the classic lib64 layout).
LIBRARY_GLOBS = ("/usr/lib/*-linux-gnu*", "/usr/lib64")
PATHS_SCRIPT = (
    "import json, sys, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps({'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], "
    "'purelib': p['purelib'], 'platlib': p['platlib'], 'prefix': sys.prefix, "
    "'site': [s for s in sys.path if s.endswith(('site-packages', 'dist-packages'))]}))"
)


def sandbox_python() -> Path:
    """The interpreter the sandbox runs: the system one if present, so no host prefix such as a
    pyenv install under /root needs to be visible inside; else this interpreter's base prefix."""
    system = Path("/usr/bin/python3")
    if system.exists():
        return system
    return Path(sys.base_prefix) / "bin" / "python3"


@functools.cache
def interpreter_paths(python: Path) -> dict:
    """Where `python` keeps its standard library and its package directories (asked once)."""
    out = subprocess.run(
        [str(python), "-I", "-c", PATHS_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    paths = json.loads(out)
    paths["site"] = sorted({*paths["site"], paths["purelib"], paths["platlib"]})
    return paths


def hidden_paths(python: Path) -> list[str]:
    """Package directories of the sandbox interpreter: never visible inside (checked by tests)."""
    return interpreter_paths(python)["site"]


def _ro_bind(host: str | Path, inside: str | Path | None = None) -> list[str]:
    return ["--ro-bind", str(host), str(inside or host)]


def runtime_binds(python: Path) -> list[str]:
    """bwrap arguments for the minimal read-only runtime of `python` (and /bin/bash)."""
    binds = _ro_bind("/usr/bin")
    for pattern in LIBRARY_GLOBS:
        for lib in sorted(glob.glob(pattern)):
            if Path(lib).is_dir() and not Path(lib).is_symlink():
                binds += _ro_bind(lib)
    for link in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / link
        if host.is_symlink():
            binds += ["--symlink", os.readlink(host), f"/{link}"]
        elif host.is_dir():
            binds += _ro_bind(host)
    paths = interpreter_paths(python)
    if not python.is_relative_to("/usr/bin"):
        binds += _ro_bind(python.resolve(), python)
        for lib in sorted(glob.glob(f"{paths['prefix']}/lib/libpython*")):
            binds += _ro_bind(lib)
    for stdlib in sorted({paths["stdlib"], paths["platstdlib"]}):
        binds += _ro_bind(stdlib)
    for site in paths["site"]:
        # A package directory inside a bound tree (e.g. <stdlib>/site-packages) is masked.
        if any(Path(site).is_relative_to(p) for p in (paths["stdlib"], paths["platstdlib"])):
            binds += ["--tmpfs", site]
    return binds
