"""The program a warm sandbox runs *before* it knows its code (`rlkit.sandbox.pool`).

Not imported by rlkit: its source is the sandboxed program. It announces readiness with one
line on stdout (`READY`), then reads its request from stdin: a decimal byte count on one line
and that many bytes of JSON ({"code", "language", "files", "memory_mb", "cpu_seconds",
"nproc"}); whatever follows on stdin is the program's own stdin. It lowers its rlimits to the
request's (never above the pool's, which the kernel forbids), writes the files into the working
directory and runs the code as `__main__` in this already started interpreter (Python) or execs
bash, so a request pays neither bubblewrap's nor the interpreter's start.
"""

import base64
import json
import linecache
import os
import resource
import sys
import traceback
import types

READY = b"\x00rlkit-ready\n"
PROGRAM = "/program/main.py"


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
    return json.loads(read_exactly(int(size)))


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
            f.write(base64.b64decode(content))


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
        kind, value, tb = sys.exc_info()
        traceback.print_exception(kind, value, tb.tb_next if tb is not None else None)
        sys.exit(1)


def main() -> None:
    os.write(1, READY)
    request = read_request()
    apply_limits(request)
    write_files(request["files"])
    if request["language"] == "bash":
        with open("/tmp/main.sh", "w") as f:
            f.write(request["code"])
        os.execv("/bin/bash", ["/bin/bash", "/tmp/main.sh"])
    run_python(request["code"])


if __name__ == "__main__":
    main()
