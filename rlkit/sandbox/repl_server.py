"""The interpreter loop that runs *inside* the sandbox for a `PythonSession`.

Not imported by rlkit: its source is the sandboxed program. It reads one JSON request per line
({"code": ...}) from stdin, runs the cell in one persistent namespace with file descriptors 1 and
2 redirected to a capture file (so prints, tracebacks and subprocess output all land there, in
order), echoes the value of a trailing expression like a notebook, and answers with one JSON line
({"output", "truncated", "error"}) on a private duplicate of the original stdout.

A cell's processes end with the cell: whatever it started that still runs when it returns (a
background child, a daemon it spawned) is killed before the answer goes out, so a session
holds no CPU between its cells and its slot on the service means what it says.
"""

import ast
import json
import os
import signal
import sys
import tempfile
import traceback

OUTPUT_LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 16384


def run_cell(code: str, namespace: dict) -> bool:
    """Execute a cell; True when it raised. The last expression's repr is printed."""
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        return False
    except SystemExit as exc:
        print(f"SystemExit: {exc.code}", file=sys.stderr)
        return True
    except BaseException:
        kind, value, tb = sys.exc_info()
        # Drop this file's own frames so the model sees only its cell in the traceback.
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        traceback.print_exception(kind, value, tb)
        return True


def _parent(pid: str) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def end_strays() -> None:
    """Kill what the cell left running: in a sandbox (bubblewrap's init is pid 1) every process
    but init and this one; elsewhere this process's descendants. Own children are reaped."""
    me = os.getpid()
    try:
        with open("/proc/1/comm") as f:
            contained = f.read().strip() == "bwrap"
    except OSError:
        contained = False
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            try:
                parents[int(entry)] = _parent(entry)
            except (OSError, ValueError, IndexError):
                continue
    if contained:
        victims = list(parents)
    else:
        victims, todo = [], [me]
        while todo:
            parent = todo.pop()
            children = [pid for pid, ppid in parents.items() if ppid == parent]
            victims += children
            todo += children
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    for pid in victims:
        if parents[pid] == me:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def main() -> None:
    # Private copies of the pipes: cells that call input() or write to fd 1 cannot touch them.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    namespace: dict = {"__name__": "__main__"}
    # Unbuffered text streams keep prints and subprocess output in the order they happened.
    sys.stdout.reconfigure(write_through=True, line_buffering=True)
    sys.stderr.reconfigure(write_through=True, line_buffering=True)
    protocol.write(json.dumps({"ready": True}) + "\n")  # startup is not billed to a cell
    protocol.flush()
    for line in requests:
        code = json.loads(line)["code"]
        with tempfile.TemporaryFile() as capture:
            sys.stdout.flush()
            sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(capture.fileno(), 1)
            os.dup2(capture.fileno(), 2)
            try:
                error = run_cell(code, namespace)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            end_strays()
            size = capture.seek(0, os.SEEK_END)
            capture.seek(0)
            data = capture.read(OUTPUT_LIMIT)
        reply = {
            "output": data.decode("utf-8", errors="replace"),
            "truncated": size > OUTPUT_LIMIT,
            "error": error,
        }
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
