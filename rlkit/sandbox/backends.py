"""Sandbox backends: how one untrusted program is started (`Backend`), and the registry of them.

`[sandbox] backend` (or `RLKIT_SANDBOX_BACKEND`) names a registered backend (`BACKENDS`:
`bwrap`, isolated, the default; `local`, NO isolation, only when chosen explicitly), an
installed entry point (group `rlkit.sandbox_backends`) or the user's own class
(`"my_pkg.my_module:MyBackend"`), so adding a backend is one file and no edit of rlkit.
`rlkit.sandbox.runner` resolves the chosen one and fails closed when it cannot run here.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from contextlib import AbstractContextManager
from typing import ClassVar, Protocol

from pydantic import BaseModel

from rlkit.registry import Registry
from rlkit.sandbox.launch import Launch, Mounts, prepare_bwrap, prepare_local
from rlkit.sandbox.limits import Limits

INSTALL_HINT = (
    "install bubblewrap and util-linux (Debian/Ubuntu: `apt-get install bubblewrap util-linux`; "
    "in a container, allow unprivileged user namespaces), then check with `rlkit sandbox check`. "
    "To run untrusted code WITHOUT isolation instead, choose it explicitly: "
    "RLKIT_SANDBOX_BACKEND=local"
)


class Backend(Protocol):
    """One way to start a sandboxed program; instantiated without arguments.

    `isolated = False` declares that programs run on the host (every run start that resolves
    such a backend logs a loud warning, and `rlkit sandbox check` fails). `problem()` is None
    when the backend can run programs here, else why not and the fix: the sandbox then refuses
    to run anything. `prepare` is a context manager yielding the `Launch` (argv and process
    settings) of one program and releasing what it set up on the host afterwards.
    """

    name: ClassVar[str]
    isolated: ClassVar[bool]

    def problem(self) -> str | None: ...

    def prepare(
        self,
        code: str,
        language: str,
        files: dict[str, str | bytes],
        limits: Limits,
        mounts: Mounts | None = None,
    ) -> AbstractContextManager[Launch]: ...


BACKENDS: Registry[type[Backend]] = Registry(
    "sandbox backend", "rlkit.sandbox_backends", BaseModel, form="module:Class"
)
PROTOCOL_ATTRS = ("name", "isolated", "problem", "prepare")


def backend_class(name: str) -> type[Backend]:
    """The backend class `name` names; ValueError when it is unknown or not a `Backend`."""
    cls = BACKENDS.get(name).fn
    missing = [attr for attr in PROTOCOL_ATTRS if not hasattr(cls, attr)]
    if not isinstance(cls, type) or missing:
        raise ValueError(
            f"sandbox backend {name!r} is not a Backend class (rlkit.sandbox.backends.Backend): "
            f"it lacks {', '.join(missing) or 'a class'}"
        )
    return cls


@functools.cache
def bwrap_self_test() -> str | None:
    """None when bubblewrap can run the sandbox here, else the reason it cannot."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian package `bubblewrap`)"
    if shutil.which("prlimit") is None or shutil.which("setpriv") is None:
        return "prlimit/setpriv are not installed (Debian package `util-linux`)"
    try:
        with prepare_bwrap("print('sandbox-ok')", "python", {}, Limits(20, 256)) as launch:
            proc = subprocess.run(
                launch.argv,
                pass_fds=launch.pass_fds,
                capture_output=True,
                text=True,
                timeout=30,
            )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"bwrap self-test failed: {exc}"
    if proc.returncode != 0 or proc.stdout.strip() != "sandbox-ok":
        return f"bwrap self-test failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return None


@BACKENDS.register("bwrap")
class Bwrap:
    """Bubblewrap: every namespace unshared, a fresh tmpfs workdir, rlimits (the default)."""

    name: ClassVar[str] = "bwrap"
    isolated: ClassVar[bool] = True

    def problem(self) -> str | None:
        problem = bwrap_self_test()
        return None if problem is None else f"{problem}; {INSTALL_HINT}"

    prepare = staticmethod(prepare_bwrap)


@BACKENDS.register("local")
class Local:
    """NO isolation: a temp dir, rlimits and a timeout on the host; an explicit opt-in only."""

    name: ClassVar[str] = "local"
    isolated: ClassVar[bool] = False

    def problem(self) -> str | None:
        return None

    prepare = staticmethod(prepare_local)
