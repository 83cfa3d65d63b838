"""rlkit's test driver inside the SWE sandbox (copied read-only next to the repository, never
imported by rlkit itself): runs pytest in-process with a recording plugin and writes the
verdict to a file only it knows, authenticated with a key only it was given.

It reads one JSON line from stdin (then points stdin at /dev/null): `key` (hex HMAC key),
`report` (the report's path), `paths` (import roots appended after the standard library:
pytest's runtime tree first, then the repository's roots) and `args` (pytest's arguments).
The report is `{"body": <json>, "mac": <hmac-sha256 of body>}`, body `{"collected": [node ids],
"outcomes": {node: PASSED/FAILED/ERROR/SKIPPED/XFAIL/XPASS}, "inconsistent": [nodes],
"exit_code": n}`. After writing it the driver leaves with `os._exit`, so no `atexit` hook or
pending finaliser of the code under test runs after the verdict.

`inconsistent` names tests with two reports for one phase, or whose call phase raised (seen by
the outermost wrapper of `pytest_runtest_call`) but whose report says passed, or that were
reported passed without the call hook running: a report patched or fabricated after the fact.
"""

import hashlib
import hmac
import json
import os
import sys


def _recorder(pytest):  # type: ignore[no-untyped-def]
    class Recorder:
        def __init__(self):  # type: ignore[no-untyped-def]
            self.collected = []
            self.phases = {}
            self.raised = {}
            self.inconsistent = set()
            self.subtest_failed = set()

        def pytest_collection_finish(self, session):  # type: ignore[no-untyped-def]
            self.collected = [item.nodeid for item in session.items]

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):  # type: ignore[no-untyped-def]
            try:
                result = yield
            except BaseException:
                self.raised[item.nodeid] = True
                raise
            self.raised.setdefault(item.nodeid, False)
            return result

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_logreport(self, report):  # type: ignore[no-untyped-def]
            node = report.nodeid
            if type(report).__name__ == "SubtestReport" or hasattr(report, "context"):
                # a subtest (pytest 9): a failing one fails its test, as the terminal shows it
                if report.failed:
                    self.subtest_failed.add(node)
                return
            phases = self.phases.setdefault(node, {})
            if report.when in phases:
                self.inconsistent.add(node)  # one report per phase and test
            phases[report.when] = (report.outcome, hasattr(report, "wasxfail"))
            if report.when == "call" and report.outcome == "passed":
                if self.raised.get(node, True):  # raised, or the call never ran
                    self.inconsistent.add(node)

        def outcomes(self):  # type: ignore[no-untyped-def]
            found = {}
            for node, phases in self.phases.items():
                outcome = None
                setup = phases.get("setup")
                call = phases.get("call")
                if setup and setup[0] == "skipped":
                    outcome = "XFAIL" if setup[1] else "SKIPPED"
                elif call:
                    verdict, xfail = call
                    if verdict == "failed":
                        outcome = "FAILED"
                    elif verdict == "skipped":
                        outcome = "XFAIL" if xfail else "SKIPPED"
                    elif node in self.subtest_failed:
                        outcome = "FAILED"
                    else:
                        outcome = "XPASS" if xfail else "PASSED"
                if any(p[0] == "failed" for w, p in phases.items() if w != "call"):
                    outcome = "ERROR"
                if outcome is not None:
                    found[node] = outcome
            return found

    return Recorder()


def main():  # type: ignore[no-untyped-def]
    config = json.loads(sys.stdin.readline())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    key = bytes.fromhex(config.pop("key"))
    report_path = config.pop("report")
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        os.environ.pop(name, None)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.path[:] = [p for p in sys.path if p and os.path.isabs(p)] + config["paths"]
    sys.argv = ["pytest"]
    code = 3
    recorder = None
    try:
        import pytest

        recorder = _recorder(pytest)
        code = int(pytest.main(config["args"], plugins=[recorder]))
    except BaseException as exc:  # the code under test may raise anything, SystemExit included
        print(f"rlkit grader: pytest raised {type(exc).__name__}: {exc}", flush=True)
    body = json.dumps(
        {
            "collected": recorder.collected if recorder else [],
            "outcomes": recorder.outcomes() if recorder else {},
            "inconsistent": sorted(recorder.inconsistent) if recorder else [],
            "exit_code": code,
        }
    )
    mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(report_path, flags, 0o600)
    data = json.dumps({"body": body, "mac": mac}).encode()
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
