"""The grading harness that runs *inside* the sandbox: all tests of one problem in one run.

The interpreter starts once per problem, and each test runs in a child forked from the clean
harness, so tests share no state and each has its own wall-clock timeout (its process group is
killed when it expires). Expected outputs never enter the sandbox: a program's stdout comes back
as the SHA-256 of its normalised text, and a function's return value as JSON; the host compares.

stdin: JSON {"style": "stdio"|"function", "fn_name", "inputs": [...], "timeout": seconds};
the program is ./solution.py. stdout: one JSON line per test, {"index", "status", "digest"} or
{"index", "status", "result"}. The host also imports `digest` from here, so both sides agree.
"""

import hashlib
import json
import os
import select
import signal
import sys
import tempfile
import traceback

RESULT_LIMIT = 1 << 15  # characters of a function's JSON return value (15 fit in 1 MiB)


def normalize_stdout(text: str) -> str:
    """Lines without trailing whitespace, without leading/trailing blank lines at the end."""
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def digest(text: str) -> str:
    return hashlib.sha256(normalize_stdout(text).encode()).hexdigest()


def _run_program(source: str, name: str) -> int:
    """Execute the solution as a module named `name`; the exit code it would have."""
    try:
        exec(compile(source, "solution.py", "exec"), {"__name__": name})
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def _child(job: dict, test_input: object, source: str, stdin_path: str, out_path: str) -> None:
    """In the forked child: wire stdin/stdout to files, run the test, never return."""
    code = 1
    try:
        os.setpgid(0, 0)
        os.dup2(os.open(stdin_path, os.O_RDONLY), 0)
        os.dup2(os.open(out_path, os.O_WRONLY | os.O_TRUNC), 1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # a chatty test must not flood the harness
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        if job["style"] == "stdio":
            code = _run_program(source, "__main__")
        else:
            namespace = {"__name__": "solution"}
            exec(compile(source, "solution.py", "exec"), namespace)
            fn = namespace.get(job["fn_name"])
            if fn is None and isinstance(namespace.get("Solution"), type):
                fn = getattr(namespace["Solution"](), job["fn_name"])
            result = json.dumps(fn(*test_input))
            sys.stdout.flush()
            os.ftruncate(1, 0)  # the file now carries only the return value
            os.lseek(1, 0, os.SEEK_SET)
            os.write(1, result.encode())
            code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_test(job: dict, index: int, source: str, workdir: str) -> dict:
    test_input = job["inputs"][index]
    stdin_path = os.path.join(workdir, f"stdin_{index}")
    out_path = os.path.join(workdir, f"stdout_{index}")
    with open(stdin_path, "w") as f:
        f.write(test_input if job["style"] == "stdio" else "")
    open(out_path, "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(job, test_input, source, stdin_path, out_path)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it (or is gone)
    pidfd = os.pidfd_open(pid)
    finished, _, _ = select.select([pidfd], [], [], job["timeout"])
    os.close(pidfd)
    try:
        os.killpg(pid, signal.SIGKILL)  # the test's own background processes die with it
    except ProcessLookupError:
        pass
    _, wait_status = os.waitpid(pid, 0)
    record = {"index": index}
    if not finished:
        record["status"] = "timeout"
    elif os.waitstatus_to_exitcode(wait_status) != 0:
        record["status"] = "runtime_error"
    elif job["style"] == "stdio":
        with open(out_path, encoding="utf-8", errors="replace") as f:
            record.update(status="ok", digest=digest(f.read()))
    else:
        with open(out_path, encoding="utf-8", errors="replace") as f:
            result = f.read(RESULT_LIMIT + 1)
        too_big = len(result) > RESULT_LIMIT
        record.update(
            status="output_limit" if too_big else "ok", result=None if too_big else result
        )
    os.unlink(stdin_path)
    os.unlink(out_path)
    return record


def main() -> None:
    job = json.loads(sys.stdin.read())
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    workdir = tempfile.mkdtemp()
    for index in range(len(job["inputs"])):
        print(json.dumps(run_test(job, index, source, workdir)), flush=True)


if __name__ == "__main__":
    main()
