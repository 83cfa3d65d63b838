"""Run a repository's pytest tests in the sandbox and read each test's outcome from a channel the
code under test cannot write to by printing.

Nothing that decides the verdict comes from the repository:

- the runner is rlkit's driver (`swe_env/grader.py`, bound read-only outside the repository),
  started as `python3 -P -s -S -B` (the working directory is not on sys.path; no site, so no
  sitecustomize, usercustomize or .pth file runs; no bytecode) with an environment the script
  sets itself; it puts the standard library first, then pytest's read-only runtime tree, then
  the repository's import roots, so no repository `pytest.py`, `_pytest/`, `pluggy/` or
  standard-library name can stand in for the runner;
- the configuration is an rlkit-owned ini file (`-c`, `--rootdir`, `--confcutdir`) holding only
  harmless settings of the *task's original* configuration (`SAFE_SETTINGS`: warnings filters,
  markers, collection names): no `addopts`, `-p`, `pythonpath` or `required_plugins`;
  `PYTEST_DISABLE_PLUGIN_AUTOLOAD`, no cache provider; and the grader reverts changes to every
  runner, configuration and start-up file anyway (`tasks.GRADER_PROTECTED`);
- outcomes come from the driver's own plugin, not from the output: it records each test's
  phases and writes a report, MAC'd with a per-run random key (given on stdin, then stdin is
  closed), to a file whose random name only it knows, then leaves with `os._exit` (no `atexit`
  hook of the code under test runs after it). Stray `PASSED node` lines on stdout are ignored.
  The report is parsed strictly: a bad MAC, outcomes for tests never collected, a test reported
  passed although its call raised (or never ran), or pytest / pluggy functions that decide
  outcomes (`grader.CRITICAL`, the hook callers, an item's own `runtest`) replaced since the
  driver started is a forged verdict; a run whose outcomes do not cover every collected test is
  incomplete and passes nothing;
- a canary: a test known to fail (`assert False`), random file and function name per run, is
  written next to the graded tests and run with them. If it does not come back FAILED the
  whole verdict is forged (`Verdict.forged`; the rollout scores 0 with `verdict_forged`).

What remains possible in principle: the code under test runs in the same interpreter as pytest
(tests import it), so it can read the process's memory (the key, the report's name, the
plugin's state) and patch anything, the driver's plugin and its snapshot included, or replace
what the checks do not cover (the test functions themselves, fixtures, an item's `obj`), before
the verdict is written; a process it forks could also rewrite the report in the moment before
the sandbox ends. The checks make the cheap forgeries fail: the canary catches every blanket
forgery (patching pytest's reports, hooks or test bodies for all tests also turns the canary,
which it cannot tell from the real tests, into a pass), the contradiction check catches reports
patched after the call, and the snapshot catches patching pytest's runner even when aimed at
exactly the graded node ids (which the issue names). What is left is work written against this
driver's internals, and it is visible in the rollout (`swe_env.exploits` detectors).
"""

from __future__ import annotations

import configparser
import functools
import hashlib
import hmac
import json
import os
import posixpath
import secrets
import shlex
import shutil
import stat
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit import sandbox
from rlkit.sandbox.launch import PYTHONPATH_ROOT, WORKDIR, Mounts
from rlkit.sandbox.result import SandboxResult
from rlkit.sandbox.runtime import runtime_tree
from rlkit.sandbox.workspace import base_dir, writable_copy

GRADER = Path(__file__).with_name("grader.py")
PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "-rA", "--tb=short", "--color=no"]
OUTCOMES = {"PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"}
# pytest's configuration files in its order of precedence (pytest 9)
CONFIG_FILES = (
    "pytest.toml",
    ".pytest.toml",
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
# settings carried over from the task's original configuration: what tests mean, not what runs
SAFE_SETTINGS = (
    "filterwarnings",
    "markers",
    "xfail_strict",
    "python_files",
    "python_classes",
    "python_functions",
    "doctest_optionflags",
    "usefixtures",
    "empty_parameter_set_mark",
)
MAX_REPORT_BYTES = 64 * 2**20


def repo_prelude(pythonpath: list[str]) -> list[str]:
    """Shell lines the agent's `bash` commands start with: in the repository, its import roots
    in front of the runtime tree, no bytecode written, a fixed hash seed."""
    roots = ":".join(shlex.quote(_root(p)) for p in pythonpath)
    return [
        "cd /sandbox",
        f'export PYTHONPATH={roots}:"$PYTHONPATH"',
        "export PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0",
    ]


def _root(path: str) -> str:
    return posixpath.normpath(f"{WORKDIR}/{path}")


# The grader's program: the driver, with an environment it sets itself (the working directory
# off sys.path with -P, no site with -S / -s), its configuration on stdin.
GRADER_SCRIPT = "\n".join(
    [
        f"cd {WORKDIR}",
        "unset PYTHONPATH",
        "export PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
        f"exec python3 -P -s -S -B {PYTHONPATH_ROOT}/1/grader.py 2>&1",
    ]
)


def _ini_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _config_section(path: Path) -> dict[str, Any] | None:
    """The pytest section of one configuration file (None: the file has none)."""
    name = path.name
    if name.endswith(".toml"):
        document = tomllib.loads(path.read_text())
        if name != "pyproject.toml":
            return document.get("pytest") or {}
        tool = document.get("tool", {}).get("pytest")
        if tool is None:
            return None
        return tool.get("ini_options") or {k: v for k, v in tool.items() if k != "ini_options"}
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(path.read_text())
    section = "tool:pytest" if name == "setup.cfg" else "pytest"
    if parser.has_section(section):
        return dict(parser[section])
    return {} if name.endswith("pytest.ini") else None


def pytest_settings(tree: Path) -> dict[str, str]:
    """`SAFE_SETTINGS` of the tree's root pytest configuration (the first file that has one,
    in pytest's order), as ini values."""
    for name in CONFIG_FILES:
        path = tree / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            section = _config_section(path)
        except (OSError, ValueError, configparser.Error):
            continue  # pytest would refuse it; the grader's own settings still hold
        if section is not None:
            return {k: _ini_value(v) for k, v in section.items() if k in SAFE_SETTINGS}
    return {}


def grader_ini(settings: dict[str, str]) -> str:
    """rlkit's pytest.ini holding `settings` (multi-line values indented)."""
    lines = ["[pytest]"]
    for key, value in sorted(settings.items()):
        parts = [p.strip() for p in value.splitlines() if p.strip()]
        if len(parts) <= 1:
            lines.append(f"{key} = {parts[0] if parts else ''}")
        else:
            lines += [f"{key} =", *(f"    {p}" for p in parts)]
    return "\n".join(lines) + "\n"


class SandboxFailure(RuntimeError):
    """The sandbox itself failed: the rollout is errored (kept out of training), not scored 0."""


@dataclass
class Verdict:
    """What the driver's report says about one run, checked.

    `outcomes`: node id -> outcome, only when the report is authentic, complete and not forged
    (else empty: nothing passed). `forged`: why the verdict cannot be trusted (a bad report, a
    contradiction, the canary not failing), None when nothing was found.
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    complete: bool = False
    forged: str | None = None
    canary: str | None = None


@functools.cache
def pytest_runtime() -> Path:
    """The read-only tree with pytest and its requirements that sandboxed runs import."""
    return runtime_tree("pytest")


def mounts(repo: Path) -> Mounts:
    """The repository copy read-write at /sandbox, the pytest runtime read-only."""
    return Mounts(workdir=repo, pythonpath=(pytest_runtime(),))


def _read_report(path: Path) -> dict[str, Any] | None:
    """The report file's JSON (None: no report); ValueError for anything but a plain file of
    bounded size holding a JSON object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"the report is not a plain file ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_REPORT_BYTES:
            raise ValueError("the report is not a plain file of bounded size")
        data = json.loads(handle.read())
    if not isinstance(data, dict):
        raise ValueError("the report is not a JSON object")
    return data


def check_report(data: dict[str, Any] | None, key: bytes, canary: str | None) -> Verdict:
    """The verdict of a driver report (see `grader.py`), parsed strictly."""
    if data is None:  # killed, timed out, or exited before reporting: nothing passed
        return Verdict(canary=canary)
    body, mac = data.get("body"), data.get("mac")
    if set(data) != {"body", "mac"} or not isinstance(body, str) or not isinstance(mac, str):
        return Verdict(canary=canary, forged="the report is malformed")
    expected = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, expected):
        return Verdict(canary=canary, forged="the report's MAC does not match")
    report = json.loads(body)
    if not isinstance(report, dict):
        return Verdict(canary=canary, forged="the report is malformed")
    collected, reported = report.get("collected"), report.get("outcomes")
    inconsistent, tampered = report.get("inconsistent"), report.get("tampered")
    if (
        not isinstance(collected, list)
        or not all(isinstance(n, str) for n in collected)
        or not isinstance(reported, dict)
        or not all(isinstance(n, str) and o in OUTCOMES for n, o in reported.items())
        or not isinstance(inconsistent, list)
        or not isinstance(tampered, list)
    ):
        return Verdict(canary=canary, forged="the report is malformed")
    verdict = Verdict(reported=reported, collected=collected, canary=canary)
    verdict.complete = bool(collected) and set(reported) == set(collected)
    if set(reported) - set(collected):
        verdict.forged = f"{len(set(reported) - set(collected))} outcome(s) for uncollected tests"
    elif tampered:
        verdict.forged = f"pytest's internals were patched: {tampered[:3]}"
    elif inconsistent:
        verdict.forged = (
            f"reported passed although the test raised or never ran: {inconsistent[:3]}"
        )
    elif canary is not None and collected and canary not in collected:
        verdict.forged = "the canary test was not collected"
    elif canary is not None and verdict.complete and reported[canary] != "FAILED":
        verdict.forged = f"the canary test (known to fail) came back {reported[canary]}"
    if verdict.complete and verdict.forged is None:
        verdict.outcomes = {n: o for n, o in reported.items() if n != canary}
    return verdict


def _write_canary(repo: Path, targets: list[str]) -> str:
    """A failing test with a random name in the graded tests' directory; its node id."""
    first = targets[0] if targets else "."
    directory = first if (repo / first).is_dir() else posixpath.dirname(first)
    directory = posixpath.normpath(directory or ".")
    relpath = posixpath.normpath(f"{directory}/test_{secrets.token_hex(6)}.py")
    function = f"test_{secrets.token_hex(6)}"
    path = repo / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"def {function}():\n    assert False\n")
    path.chmod(0o644)
    return f"{relpath}::{function}"


async def run_tests(
    tree: Path,
    pythonpath: list[str],
    targets: list[str],
    timeout: float,
    memory_mb: int,
    config_tree: Path | None = None,
    canary: bool = True,
) -> tuple[SandboxResult, Verdict]:
    """Run pytest on `targets` in a sandboxed copy of `tree`; the result and the checked verdict.

    `config_tree` is where the task's original pytest configuration is read (default `tree`);
    `canary=False` leaves the canary out (trusted trees, e.g. the task factory's mutants, whose
    output becomes issue text). Raises SandboxFailure when the sandbox (not the tests) failed.
    """
    key = secrets.token_bytes(32)
    report_name = f".rlkit-verdict-{secrets.token_hex(8)}"
    grader_dir = Path(tempfile.mkdtemp(prefix="swe-grader-", dir=base_dir()))
    try:
        grader_dir.chmod(0o755)
        shutil.copyfile(GRADER, grader_dir / "grader.py")
        ini = grader_dir / "pytest.ini"
        ini.write_text(grader_ini(pytest_settings(config_tree or tree)))
        for path in (grader_dir / "grader.py", ini):
            path.chmod(0o644)
        with writable_copy(tree) as repo:
            node = _write_canary(repo, targets) if canary else None
            args = [
                f"--rootdir={WORKDIR}",
                f"--confcutdir={WORKDIR}",
                "-c",
                f"{PYTHONPATH_ROOT}/1/pytest.ini",
                *PYTEST_ARGS,
                "--",
                *targets,
                *([node.split("::")[0]] if node else []),
            ]
            config = {
                "key": key.hex(),
                "report": f"{WORKDIR}/{report_name}",
                "paths": [f"{PYTHONPATH_ROOT}/0", *(_root(p) for p in pythonpath)],
                "args": args,
            }
            result = await sandbox.run(
                GRADER_SCRIPT,
                language="bash",
                stdin=json.dumps(config) + "\n",
                timeout=timeout,
                memory_mb=memory_mb,
                mounts=Mounts(workdir=repo, pythonpath=(pytest_runtime(), grader_dir)),
            )
            if result.status == "sandbox_error":
                raise SandboxFailure(f"test sandbox failed: {result.stderr.strip()[-300:]}")
            try:
                verdict = check_report(_read_report(repo / report_name), key, node)
            except ValueError as exc:
                verdict = Verdict(canary=node, forged=f"the report is unreadable: {exc}")
    finally:
        shutil.rmtree(grader_dir, ignore_errors=True)
    return result, verdict
