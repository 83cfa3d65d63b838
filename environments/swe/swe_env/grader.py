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
`tampered` names pytest and pluggy functions (`CRITICAL`, the plugin manager's hook callers, an
item's own `runtest`) found replaced since the driver started, before any repository code ran.
"""

import hashlib
import hmac
import importlib
import json
import os
import sys

# pytest's and pluggy's code that turns a test call into its outcome: snapshotted before any
# repository code runs (conftest files included), checked before every test call and at the end
CRITICAL = (
    ("_pytest.python", "Function", "runtest"),
    ("_pytest.python", "", "pytest_pyfunc_call"),
    ("_pytest.unittest", "TestCaseFunction", "runtest"),
    ("_pytest.doctest", "DoctestItem", "runtest"),
    ("_pytest.reports", "TestReport", "from_item_and_call"),
    ("_pytest.reports", "TestReport", "__init__"),
    ("_pytest.runner", "CallInfo", "from_call"),
    ("_pytest.runner", "", "runtestprotocol"),
    ("_pytest.runner", "", "call_and_report"),
    ("_pytest.runner", "", "pytest_runtest_call"),
    ("_pytest.runner", "", "pytest_runtest_makereport"),
    ("_pytest.skipping", "", "pytest_runtest_makereport"),
    ("pluggy._callers", "", "_multicall"),
    ("pluggy._hooks", "HookCaller", "__call__"),
    ("pluggy._manager", "PluginManager", "_hookexec"),
)
# hooks whose callers must still run through the plugin manager they were made by
HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_pyfunc_call",
    "pytest_report_teststatus",
)


def _own(obj):  # type: ignore[no-untyped-def]
    """An object's instance attributes (none for slotted objects)."""
    return getattr(obj, "__dict__", None) or {}


def _critical():  # type: ignore[no-untyped-def]
    found = {}
    for module_name, owner, name in CRITICAL:
        try:
            module = importlib.import_module(module_name)
            space = vars(getattr(module, owner)) if owner else vars(module)
        except (ImportError, AttributeError):
            continue
        found[f"{module_name}.{owner}.{name}"] = space.get(name)
    return found


def _recorder(pytest):  # type: ignore[no-untyped-def]
    class Recorder:
        def __init__(self):  # type: ignore[no-untyped-def]
            self.collected = []
            self.phases = {}
            self.raised = {}
            self.inconsistent = set()
            self.subtest_failed = set()
            self.tampered = set()
            self.snapshot = _critical()

        @pytest.hookimpl(tryfirst=True)
        def pytest_configure(self, config):  # type: ignore[no-untyped-def]
            self.manager = config.pluginmanager
            self.hookexec = getattr(self.manager, "_inner_hookexec", None)
            self.callers = {n: getattr(self.manager.hook, n, None) for n in HOOKS}

        def check(self, item=None):  # type: ignore[no-untyped-def]
            """Record what was patched since the snapshot (names, once each)."""
            try:
                self.tampered.update(self.changes(item))
            except Exception as exc:  # a check that cannot run is no pass
                self.tampered.add(f"integrity check failed: {type(exc).__name__}: {exc}")

        def changes(self, item):  # type: ignore[no-untyped-def]
            now = _critical()
            found = [name for name, obj in self.snapshot.items() if now.get(name) is not obj]
            manager = getattr(self, "manager", None)
            if manager is not None:
                if getattr(manager, "_inner_hookexec", None) is not self.hookexec:
                    found.append("PluginManager._inner_hookexec")
                if "_hookexec" in _own(manager):
                    found.append("PluginManager._hookexec (instance)")
                for name, caller in self.callers.items():
                    current = getattr(manager.hook, name, None)
                    if current is not caller or "__call__" in _own(caller):
                        found.append(f"hook {name}")
                    hookexec = getattr(caller, "_hookexec", None)
                    if hookexec is not None and hookexec != manager._hookexec:
                        found.append(f"hook {name}._hookexec")
            if item is not None and {"runtest", "ihook"} & set(_own(item)):
                found.append(f"{item.nodeid}: runtest or ihook replaced on the item")
            return found

        def pytest_collection_finish(self, session):  # type: ignore[no-untyped-def]
            self.collected = [item.nodeid for item in session.items]

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):  # type: ignore[no-untyped-def]
            self.check(item)
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

        for module in {module for module, _, _ in CRITICAL}:
            importlib.import_module(module)
        recorder = _recorder(pytest)
        code = int(pytest.main(config["args"], plugins=[recorder]))
        recorder.check()
    except BaseException as exc:  # the code under test may raise anything, SystemExit included
        print(f"rlkit grader: pytest raised {type(exc).__name__}: {exc}", flush=True)
    body = json.dumps(
        {
            "collected": recorder.collected if recorder else [],
            "outcomes": recorder.outcomes() if recorder else {},
            "inconsistent": sorted(recorder.inconsistent) if recorder else [],
            "tampered": sorted(recorder.tampered) if recorder else [],
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
