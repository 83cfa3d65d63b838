"""The program a warm sandbox runs *before* it knows its code (`rlkit.sandbox.pool`).

Not imported by rlkit: its source is the sandboxed program. It announces readiness with one
line on stdout (`READY`), then reads its request from stdin: a decimal byte count on one line
and that many bytes of a `marshal`ed dict ({"code", "language", "files" (name -> bytes),
"memory_mb", "cpu_seconds", "nproc", "end"}, written by the host, which is trusted); whatever
follows on stdin is the program's own stdin. It imports only what every request needs (no
json, base64 or traceback: every pool start would pay their import, docs/benchmarks.md).

It lowers its rlimits to the request's (never above the pool's, which the kernel forbids),
writes the files into the working directory and runs the code as `__main__` in this already
started interpreter (Python) or execs bash, so a request pays neither bubblewrap's nor the
interpreter's start.

When a Python program has ended (no thread of its own still running), the loader runs its exit
handlers, flushes its output and writes `end_marker(end, code)` as the last bytes of stdout and
of stderr, then leaves without the interpreter's teardown: the host answers on the markers
instead of waiting for this interpreter, bubblewrap and the namespaces to be torn down (most of
a warm request's time). `end` is the request's own random nonce; a program that prints it early
only cuts its own output short (the host kills the sandbox on the markers either way).
"""

import atexit
import linecache
import marshal
import os
import resource
import sys
import types

READY = b"\x00rlkit-ready\n"
PROGRAM = "/program/main.py"


def end_marker(end: str, code: int) -> bytes:
    """The last bytes of each stream of a Python program that ended with `code` (the host's
    `rlkit.sandbox.process` reads the same format)."""
    return b"\x00rlkit-end:%s:%d\n" % (end.encode(), code)


def read_exactly(count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = os.read(0, count - len(data))
        if not chunk:
            sys.exit(0)  # the host gave up on this sandbox before sending a request
        data += chunk
    return bytes(data)


def read_request() -> dict:
    """The header, read byte by byte up to its newline so no program stdin is consumed."""
    size = b""
    while not size.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(size) > 20:
            sys.exit(0)
        size += byte
    return marshal.loads(read_exactly(int(size)))


def lower(kind: int, value: int) -> None:
    """Set an rlimit to `value` unless that would raise it above the pool's hard limit (the CPU
    limit's hard value sits 1 s above its soft one: SIGXCPU first, then SIGKILL)."""
    margin = 1 if kind == resource.RLIMIT_CPU else 0
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard - margin)
    resource.setrlimit(kind, (value, value + margin))


def apply_limits(request: dict) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(usage.ru_utime + usage.ru_stime) + 1
    lower(resource.RLIMIT_CPU, spent + request["cpu_seconds"])
    lower(resource.RLIMIT_AS, request["memory_mb"] << 20)
    lower(resource.RLIMIT_NPROC, request["nproc"])


def write_files(files: dict) -> None:
    for name, content in files.items():
        parent = os.path.dirname(name)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(name, "wb") as f:
            f.write(content)


def run_python(code: str) -> None:
    """Run `code` as a fresh `__main__` would: uncaught errors print a traceback (without
    this loader's frame) and exit 1; SystemExit ends the interpreter with its code."""
    linecache.cache[PROGRAM] = (len(code), None, code.splitlines(True), PROGRAM)
    main = types.ModuleType("__main__")
    main.__file__ = PROGRAM
    sys.modules["__main__"] = main
    sys.argv = [PROGRAM]
    try:
        exec(compile(code, PROGRAM, "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException:
        import traceback  # only for a program that failed

        kind, value, tb = sys.exc_info()
        traceback.print_exception(kind, value, tb.tb_next if tb is not None else None)
        sys.exit(1)


def exit_code(exc: SystemExit) -> int:
    """The status the interpreter would exit with for `exc` (a non-integer is printed)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def own_threads_running() -> bool:
    threading = sys.modules.get("threading")
    if threading is None:
        return False
    main_thread = threading.main_thread()
    return any(
        t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()
    )


def finish(end: str, code: int) -> None:
    """End as the interpreter would (exit handlers, flushed output), then mark both streams and
    leave at once; a program that still runs threads, or whose output cannot be flushed, ends
    through the interpreter's own exit instead (the host then waits for the sandbox to end)."""
    if own_threads_running():
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        sys.exit(code)
    marker = end_marker(end, code)
    try:
        os.write(1, marker)
        os.write(2, marker)
    finally:
        os._exit(code)


def warm_up() -> None:
    """Pay this interpreter's one-time cost before the request arrives: its first `compile`
    costs far more than later ones (docs/benchmarks.md)."""
    compile("pass", PROGRAM, "exec")


def main() -> None:
    warm_up()
    os.write(1, READY)
    request = read_request()
    apply_limits(request)
    write_files(request["files"])
    if request["language"] == "bash":
        with open("/tmp/main.sh", "w") as f:
            f.write(request["code"])
        os.execv("/bin/bash", ["/bin/bash", "/tmp/main.sh"])
    try:
        run_python(request["code"])
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    finish(request["end"], code)


if __name__ == "__main__":
    main()
