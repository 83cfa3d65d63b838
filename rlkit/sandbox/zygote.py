# ruff: noqa: F821  (appended to loader.py, whose names it uses: os, sys, marshal, READY, ...)
"""The fork server that runs *inside* one bubblewrap sandbox (`rlkit.sandbox.forkserver`).

Not imported by rlkit: its source, appended to the loader's (`loader.py`, whose functions it
uses), is the sandboxed program. Started with CAP_SYS_ADMIN and CAP_NET_ADMIN in the sandbox's
own user namespace (nothing on the host), it imports what a request needs once, says READY, then
for each message on its control socket (a byte and four descriptors: the
request's stdin, stdout, stderr and report socket; its descriptor number comes first, on
stdin, with the tmpfs sizes) forks a child that:

- unshares a new mount, pid, ipc, network and uts namespace and forks the request's process,
  pid 1 of that pid namespace, which mounts a fresh /proc, fresh size-capped tmpfs over
  /sandbox, /tmp and /dev/shm, brings its own loopback up, drops every capability for good
  (bounding set, no_new_privs, capset to none), sends its pid to the host (SCM_CREDENTIALS: the
  host reads its own pid for it), takes the request's pipes as 0/1/2 and becomes the loader
  (READY, then one request, exactly as a sandbox of its own);
- waits for it and reports how it ended on the report socket ("exit N" / "signal N").

So each request gets a fresh process (a fork of this unchanged server), fresh filesystem and
namespace state, and nothing of it survives it: when the request's pid 1 dies the kernel kills
every process of its pid namespace, and its mounts go with its mount namespace. The server runs
at most one child at a time (the host asks for the next once the last one is gone), so the
sandbox's RLIMIT_NPROC counts one request's processes, as for a sandbox of its own.
"""

import ctypes
import ctypes.util
import fcntl
import signal
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), what)


def _mount(source: bytes, target: bytes, kind: bytes, flags: int, data: bytes | None) -> None:
    _check(_libc.mount(source, target, kind, flags, data), f"mount {target!r}")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def _drop_capabilities() -> None:
    """No capability left, none to regain (bounding set empty, no_new_privs, capset to 0)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the kernel's last capability
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}
    _check(_libc.capset(ctypes.c_char_p(header), data), "capset")


def _become_request(sizes: dict, report: socket.socket) -> None:
    """In the request's pid 1: a fresh machine of its own, then the loader."""
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    _mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    _mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    for target, size in sizes.items():
        options = b"size=%d,mode=0755" % size
        _mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
    _loopback_up()
    socket.sethostname("sandbox")
    os.chdir("/sandbox")
    os.setsid()
    creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
    report.sendmsg([b"pid"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
    _drop_capabilities()


def _serve_one(fds: list[int], sizes: dict) -> None:
    """The forked child: new namespaces, the request's process, its ending reported."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its own child
    stdin, stdout, stderr, report_fd = fds
    report = socket.socket(fileno=report_fd)
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    try:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS
        _check(_libc.unshare(flags), "unshare")
        pid = os.fork()
        if pid == 0:
            try:
                _become_request(sizes, report)
                for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
                    os.dup2(fd, target)
                os.closerange(3, 65536)
            except BaseException as exc:
                os.write(stderr, b"sandbox setup failed: %s\n" % str(exc).encode())
                os._exit(125)
            main()  # the loader: READY, one request, its end markers
            os._exit(0)
        for fd in (stdin, stdout, stderr):
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            report.send(b"signal %d" % os.WTERMSIG(status))
        else:
            report.send(b"exit %d" % os.WEXITSTATUS(status))
    except BaseException as exc:
        with contextlib_suppress():
            report.send(b"setup %s" % str(exc).encode()[:200])
    os._exit(0)


class contextlib_suppress:  # the loader imports no contextlib: the one thing it needs
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _reap(*_: object) -> None:
    """Reap the children that have ended (at once: a zombie counts against RLIMIT_NPROC)."""
    while True:
        try:
            ended, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if ended == 0:
            return


def zygote_main() -> None:
    warm_up()
    setup = read_request()  # from the host, before READY: the control socket, tmpfs sizes
    control = socket.socket(fileno=setup["control"])
    sizes = setup["sizes"]
    signal.signal(signal.SIGCHLD, _reap)
    os.write(1, READY)
    while True:
        try:
            message, ancillary, _, _ = control.recvmsg(16, socket.CMSG_SPACE(4 * 4))
        except InterruptedError:
            continue
        if not message:
            os._exit(0)  # the host is gone
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(data) // 4}i", data))
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            control.close()
            _serve_one(fds, sizes)
        for fd in fds:
            os.close(fd)


zygote_main()
