"""How to start one sandboxed program: the bubblewrap command line or the local fallback.

`prepare_bwrap` / `prepare_local` return a `Launch` (argv + process settings) inside a context
manager that owns everything the launch needs on the host (in-memory files, pipes, a temp dir)
and releases it afterwards, so nothing a run wrote survives it.

Nothing a request names reaches a host command line (which every user of the host can read):
bubblewrap's options, file names among them, travel in an in-memory file (`bwrap --args FD`);
the command line holds only the limits and the interpreter. When rlkit runs as root, each
sandbox runs as a host uid of its own (`SandboxUid`), so no other sandbox, and nothing else
running as one shared uid, may signal, trace or read its processes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rlkit.sandbox.limits import MIB, SHM_MB, TMP_MB, WORKDIR_MB, Limits
from rlkit.sandbox.rootfs import runtime_binds, sandbox_python

WORKDIR = "/sandbox"
# Where `Mounts.pythonpath` directories appear inside the sandbox (/opt/pythonpath/0, /1, ...).
PYTHONPATH_ROOT = "/opt/pythonpath"
# Host uid/gid the sandbox runs as when rlkit itself runs as root: an escape lands as `nobody`,
# not root, and the kernel applies RLIMIT_NPROC (it exempts root).
NOBODY = 65534
# The host uids sandboxes run as when rlkit runs as root: one per live sandbox, held with an
# abstract socket so that processes of several rlkit programs on one host never share one
# (`SandboxUid`).
UID_BASE = 1_500_000_000
UID_COUNT = 1_000_000
PROGRAM_NAMES = {"python": "main.py", "bash": "main.sh"}
# A file name longer than this (or a path component over NAME_MAX) is refused.
MAX_NAME = 1024


def interpreter(language: str) -> list[str]:
    """The command that runs a program file written in `language`."""
    if language == "python":
        return [str(sandbox_python()), "-B"]
    if language == "bash":
        return ["/bin/bash"]
    raise ValueError(f"unsupported sandbox language {language!r}; use one of {list(PROGRAM_NAMES)}")


def check_relative(name: str) -> PurePosixPath:
    """A `files` key must be a plain relative path inside the working directory."""
    path = PurePosixPath(name)
    if (
        path.is_absolute()
        or ".." in path.parts
        or not path.parts
        or "\x00" in name
        or len(name) > MAX_NAME
        or any(len(part.encode()) > 255 for part in path.parts)
    ):
        raise ValueError(
            f"sandbox file name {name[:100]!r} must be a relative path inside the workdir "
            f"(no NUL byte, at most {MAX_NAME} characters)"
        )
    return path


def check_names(files: dict[str, str | bytes]) -> None:
    """ValueError unless every file name is one `check_relative` accepts."""
    for name in files:
        check_relative(name)


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


def _memfd(content: bytes) -> int:
    """An in-memory file holding `content` (its name, seen in /proc, is always the same)."""
    fd = os.memfd_create("rlkit-sandbox", 0)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class SandboxUid:
    """A host uid no other live sandbox on this host holds (rlkit runs as root): a random one of
    `UID_COUNT` from `UID_BASE`, held by binding an abstract unix socket named after it
    (`uid_lock_name`) until `release()`. The kernel frees the name when its holder dies, SIGKILL
    included, so nothing of it outlives a killed service (lock files did: one per sandbox it
    held). Another local user binding names can only make uids be passed over, never shared.
    Not root: None (every sandbox runs as this user; see the README)."""

    def __init__(self) -> None:
        self.uid: int | None = None
        self._lock: socket.socket | None = None
        if os.geteuid() != 0:
            return
        while self.uid is None:
            n = secrets.randbelow(UID_COUNT)
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                lock.bind(uid_lock_name(UID_BASE + n))
            except OSError:  # held by a live sandbox
                lock.close()
                continue
            self.uid, self._lock = UID_BASE + n, lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
        self._lock = None


def uid_lock_name(uid: int) -> bytes:
    """The abstract socket name (no file) whose holder holds sandbox uid `uid`."""
    return b"\0rlkit-sandbox-uid-%d" % uid


def base_dir() -> Path:
    """The checked base directory for bindable host directories (created on first use)."""
    base = Path(os.environ.get("RLKIT_SANDBOX_DIR") or f"/tmp/rlkit-sandbox-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o711, parents=True)
    info = base.lstat()
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise RuntimeError(
            f"sandbox base directory {base} must be a directory owned by uid {os.geteuid()} "
            "and writable by nobody else"
        )
    base.chmod(0o711)
    return base


def _drop_root(uid: int | None) -> list[str]:
    """When rlkit runs as root, start bwrap as `uid` (the sandbox's own) through util-linux
    `setpriv`.

    An exec'd wrapper instead of subprocess's `user=`: Python must fork (not vfork) to change
    uid itself, which is slow in a large process such as a trainer (docs/benchmarks.md).
    """
    if os.geteuid() != 0:
        return []
    uid = NOBODY if uid is None else uid
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _workdir_owner(workdir: Path) -> int | None:
    """A bound working directory is written as its owner (`workspace.writable_copy` gives each
    copy a uid of its own); one root owns is written as `nobody`."""
    owner = workdir.stat().st_uid
    return owner if owner != 0 else None


@contextlib.contextmanager
def prepare_bwrap(
    code: str,
    language: str,
    files: dict[str, str | bytes],
    limits: Limits,
    mounts: Mounts | None = None,
    *,
    caps: tuple[str, ...] = (),
    keep_fds: tuple[int, ...] = (),
) -> Iterator[Launch]:
    """A bubblewrap launch: every namespace unshared (no network), a fresh size-capped tmpfs as
    the working directory (or `mounts.workdir`) holding `files`, the program read-only at
    /program, no host env; /dev read-only but for a size-capped /dev/shm; its options in an
    in-memory file, as a uid of its own when rlkit runs as root. `caps`: capabilities the
    program keeps inside its own user namespace (the fork server's); `keep_fds`: descriptors
    it inherits."""
    mounts = mounts or Mounts()
    command = interpreter(language)
    program = f"/program/{PROGRAM_NAMES[language]}"
    launch = Launch(argv=[])
    status_read: int | None = None
    owner = SandboxUid() if mounts.workdir is None else None
    try:
        status_read, status_write = os.pipe()
        launch.ending = functools.partial(_bwrap_ending, status_read)
        launch.child_fds.append(status_write)
        program_fd = _memfd(code.encode())
        launch.child_fds.append(program_fd)
        file_args: list[str] = []
        files_size = 0
        for name, content in files.items():
            path = check_relative(name)
            data = as_bytes(content)
            files_size += len(data)
            fd = _memfd(data)
            launch.child_fds.append(fd)
            file_args += ["--file", str(fd), f"{WORKDIR}/{path}"]
        if mounts.workdir is None:
            work_size = WORKDIR_MB * MIB + files_size
            workdir_args = ["--size", str(work_size), "--tmpfs", WORKDIR]
            uid = owner.uid if owner is not None else None
        else:
            workdir_args = ["--bind", str(mounts.workdir), WORKDIR]
            uid = _workdir_owner(mounts.workdir)
        options = [
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
            str(SHM_MB * MIB),
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",  # --dev's own tmpfs has no size: nothing may be written there
            "/dev",
            "--size",
            str(TMP_MB * MIB),
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
            *[arg for cap in caps for arg in ("--cap-add", cap)],
        ]
        options_fd = _memfd(b"".join(arg.encode() + b"\x00" for arg in options))
        launch.child_fds.append(options_fd)
        launch.argv = [
            *_drop_root(uid),
            "bwrap",
            "--args",
            str(options_fd),
            "--",
            *limits.prlimit_args(),
            *command,
            program,
        ]
        launch.pass_fds = (*launch.child_fds, *keep_fds)
        yield launch
    finally:
        launch.close_child_fds()
        if status_read is not None:
            os.close(status_read)
        if owner is not None:
            owner.release()


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
