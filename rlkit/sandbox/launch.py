"""How to start one sandboxed program: the bubblewrap command line or the local fallback.

`prepare_bwrap` / `prepare_local` return a `Launch` (argv + process settings) inside a context
manager that owns everything the launch needs on the host (in-memory files, pipes, a temp dir)
and releases it afterwards, so nothing a run wrote survives it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rlkit.sandbox.limits import MIB, Limits
from rlkit.sandbox.rootfs import runtime_binds, sandbox_python

WORKDIR = "/sandbox"
# Where `Mounts.pythonpath` directories appear inside the sandbox (/opt/pythonpath/0, /1, ...).
PYTHONPATH_ROOT = "/opt/pythonpath"
# Host uid/gid the sandbox runs as when rlkit itself runs as root: an escape lands as `nobody`,
# not root, and the kernel applies RLIMIT_NPROC (it exempts root).
NOBODY = 65534
PROGRAM_NAMES = {"python": "main.py", "bash": "main.sh"}


def interpreter(language: str) -> list[str]:
    """The command that runs a program file written in `language`."""
    if language == "python":
        return [str(sandbox_python()), "-B"]
    if language == "bash":
        return ["/bin/bash"]
    raise ValueError(f"unsupported sandbox language {language!r}; use one of {list(PROGRAM_NAMES)}")


def check_relative(name: str) -> PurePosixPath:
    """A `files` key must stay inside the working directory."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"sandbox file name {name!r} must be a relative path inside the workdir")
    return path


def as_bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else content


@dataclass(frozen=True)
class Ending:
    """How a launched program ended, as its backend reads it."""

    exit_code: int | None  # the program's own (128 + N: killed by signal N); None: never started
    setup_failed: bool = False  # the backend failed (not the program): a `sandbox_error`


def process_ending(returncode: int, stderr: str) -> Ending:
    """A program started as the process itself (`local`): killed by signal N is 128 + N."""
    return Ending(128 - returncode if returncode < 0 else returncode)


@dataclass
class Launch:
    """Everything `asyncio.create_subprocess_exec` needs for one sandboxed program, and how its
    backend reads the way it ended (`ending(returncode, stderr)`, once it has exited)."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    preexec_fn: Callable[[], None] | None = None
    child_fds: list[int] = field(default_factory=list)
    ending: Callable[[int, str], Ending] = process_ending

    def close_child_fds(self) -> None:
        """Close the descriptors only the child needs, once it has them."""
        for fd in self.child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.child_fds.clear()


@dataclass(frozen=True)
class Mounts:
    """Host directories a run may see besides the system, each named explicitly.

    `workdir`: a host directory bound read-write as the working directory instead of a fresh
    tmpfs (a per-rollout repository copy that must outlive single commands); nothing else is
    writable except /tmp. `pythonpath`: host directories bound read-only and put on PYTHONPATH
    (a runtime tree with pytest; site-packages itself is never visible). bwrap binds by path as
    the sandbox user, so every directory must be reachable by `nobody` when rlkit runs as root
    (see `rlkit.sandbox.workspace`).
    """

    workdir: Path | None = None
    pythonpath: tuple[Path, ...] = ()

    def bwrap_binds(self) -> list[str]:
        binds: list[str] = []
        for i, path in enumerate(self.pythonpath):
            binds += ["--ro-bind", str(path), f"{PYTHONPATH_ROOT}/{i}"]
        return binds

    def env(self, local: bool) -> dict[str, str]:
        """PYTHONPATH naming the import roots as the program sees them."""
        if not self.pythonpath:
            return {}
        paths = [
            str(path) if local else f"{PYTHONPATH_ROOT}/{i}"
            for i, path in enumerate(self.pythonpath)
        ]
        return {"PYTHONPATH": ":".join(paths)}


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(name.replace("/", "_"), 0)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _drop_root() -> list[str]:
    """When rlkit runs as root, start bwrap as `nobody` through util-linux `setpriv`.

    An exec'd wrapper instead of subprocess's `user=`: Python must fork (not vfork) to change
    uid itself, which is slow in a large process such as a trainer (docs/benchmarks.md).
    """
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


@contextlib.contextmanager
def prepare_bwrap(
    code: str,
    language: str,
    files: dict[str, str | bytes],
    limits: Limits,
    mounts: Mounts | None = None,
) -> Iterator[Launch]:
    """A bubblewrap launch: every namespace unshared (no network), a fresh size-capped tmpfs as
    the working directory (or `mounts.workdir`) holding `files`, the program read-only at
    /program, no host env."""
    mounts = mounts or Mounts()
    command = interpreter(language)
    program = f"/program/{PROGRAM_NAMES[language]}"
    launch = Launch(argv=[])
    status_read: int | None = None
    try:
        status_read, status_write = os.pipe()
        launch.ending = functools.partial(_bwrap_ending, status_read)
        launch.child_fds.append(status_write)
        program_fd = _memfd(program, code.encode())
        launch.child_fds.append(program_fd)
        file_args: list[str] = []
        files_size = 0
        for name, content in files.items():
            path = check_relative(name)
            data = as_bytes(content)
            files_size += len(data)
            fd = _memfd(name, data)
            launch.child_fds.append(fd)
            file_args += ["--file", str(fd), f"{WORKDIR}/{path}"]
        work_size = 64 * MIB + 2 * files_size
        if mounts.workdir is None:
            workdir_args = ["--size", str(work_size), "--tmpfs", WORKDIR]
        else:
            workdir_args = ["--bind", str(mounts.workdir), WORKDIR]
        launch.argv = [
            *_drop_root(),
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--uid",
            str(NOBODY),
            "--gid",
            str(NOBODY),
            "--hostname",
            "sandbox",
            *runtime_binds(sandbox_python()),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(64 * MIB),
            "--tmpfs",
            "/tmp",
            *workdir_args,
            *mounts.bwrap_binds(),
            *file_args,
            "--ro-bind-data",
            str(program_fd),
            program,
            # The sandbox's own root tmpfs: read-only too (non-recursive; /tmp and WORKDIR stay rw).
            "--remount-ro",
            "/",
            "--chdir",
            WORKDIR,
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            WORKDIR,
            "--setenv",
            "LANG",
            "C.UTF-8",
            *[
                arg
                for name, value in mounts.env(local=False).items()
                for arg in ("--setenv", name, value)
            ],
            "--json-status-fd",
            str(status_write),
            "--",
            *limits.prlimit_args(),
            *command,
            program,
        ]
        launch.pass_fds = tuple(launch.child_fds)
        yield launch
    finally:
        launch.close_child_fds()
        if status_read is not None:
            os.close(status_read)


def _bwrap_ending(status_fd: int, returncode: int, stderr: str) -> Ending:
    """bwrap's JSON status documents ({"child-pid": ..}, {"exit-code": ..}, from
    --json-status-fd) tell "never started" from "the program failed"; bwrap (mounts, exec) or
    prlimit failing after the namespace existed is not the program either."""
    os.set_blocking(status_fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(status_fd, 65536):
            chunks.append(chunk)
    status: dict[str, int] = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            status.update(json.loads(line))  # one JSON document per line
    if "child-pid" not in status:
        return Ending(None, setup_failed=True)
    code = status.get("exit-code", returncode)
    code = 128 - code if code < 0 else code
    failed = (code == 1 and stderr.startswith("bwrap: ")) or (
        code in (126, 127) and stderr.startswith("prlimit: ")
    )
    return Ending(code, setup_failed=failed)


@contextlib.contextmanager
def prepare_local(
    code: str,
    language: str,
    files: dict[str, str | bytes],
    limits: Limits,
    mounts: Mounts | None = None,
) -> Iterator[Launch]:
    """The no-isolation fallback: a private temp dir (or `mounts.workdir`), rlimits and a minimal
    environment only."""
    mounts = mounts or Mounts()
    private = Path(tempfile.mkdtemp(prefix="rlkit-sandbox-"))
    workdir = mounts.workdir or private
    try:
        for name, content in files.items():
            target = workdir / check_relative(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(as_bytes(content))
        program = private / PROGRAM_NAMES[language]
        program.write_text(code)
        yield Launch(
            argv=[*interpreter(language), str(program)],
            cwd=str(workdir),
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(workdir),
                "LANG": "C.UTF-8",
                **mounts.env(local=True),
            },
            preexec_fn=limits.apply,
        )
    finally:
        shutil.rmtree(private, ignore_errors=True)
