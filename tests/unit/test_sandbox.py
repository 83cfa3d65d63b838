"""rlkit.sandbox: limits, classification and the basic statuses of real bubblewrap runs."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit import sandbox
from rlkit.sandbox import backends, runner
from rlkit.sandbox import launch as launch_mod
from rlkit.sandbox.config import SandboxConfig
from rlkit.sandbox.limits import MIB, Limits
from rlkit.sandbox.pool import Profile, WarmPool
from rlkit.sandbox.process import classify
from rlkit.sandbox.session import PythonSession
from tests.helpers.system import require_system

pytestmark = pytest.mark.system


@pytest.fixture(autouse=True)
def _bwrap_backend() -> None:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))


def test_limits_become_prlimit_arguments() -> None:
    args = Limits(timeout=2.5, memory_mb=128).prlimit_args()
    assert args[0] == "prlimit" and args[-1] == "--"
    assert "--cpu=4:5" in args
    assert f"--as={128 * MIB}" in args
    # (2048 MiB total - 192 MiB of tmpfs) / 128 MiB per process, + bwrap's init
    assert "--nproc=15" in args
    capped = Limits(timeout=1, memory_mb=16, total_memory_mb=4096).prlimit_args()
    assert "--nproc=65" in capped


def test_per_process_memory_cannot_exceed_the_total_cap() -> None:
    with pytest.raises(ValueError, match="total memory cap"):
        Limits(timeout=1, memory_mb=1024, total_memory_mb=512)


def test_a_warm_loader_takes_a_request_at_its_pools_own_limits() -> None:
    """A request for the pool's whole CPU time lowers nothing: the limit stays where it is
    (it raised 'not allowed to raise maximum limit', so every program asking for its profile's
    full timeout failed in a warm sandbox)."""
    script = (
        "import resource, sys\n"
        "from rlkit.sandbox.loader import lower\n"
        "cpu = resource.RLIMIT_CPU\n"
        "resource.setrlimit(cpu, (30, 31))\n"
        "lower(cpu, 31)\n"
        "assert resource.getrlimit(cpu) == (30, 31), resource.getrlimit(cpu)\n"
        "lower(cpu, 12)\n"
        "assert resource.getrlimit(cpu) == (12, 13), resource.getrlimit(cpu)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("exit_code", "stderr", "status"),
    [
        (0, "", "ok"),
        (1, "Traceback...\nValueError: bad\n", "runtime_error"),
        (1, "Traceback...\nMemoryError\n", "memory"),
        (128 + 9, "", "memory"),
        (128 + 11, "", "memory"),
        (128 + 24, "", "timeout"),
        (3, "", "runtime_error"),
    ],
)
def test_classify(exit_code: int, stderr: str, status: str) -> None:
    assert classify(exit_code, stderr) == status


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../b", ""])
def test_file_names_must_stay_in_the_workdir(name: str) -> None:
    with pytest.raises(ValueError, match="relative path"):
        launch_mod.check_relative(name)


async def test_ok_with_stdin_and_files() -> None:
    code = "import sys\nprint(sys.stdin.read().upper(), open('data/in.txt').read(), end='')"
    result = await sandbox.run(code, stdin="abc", files={"data/in.txt": "xyz"})
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "ABC xyz")
    assert result.duration > 0


async def test_runtime_error_keeps_the_traceback() -> None:
    result = await sandbox.run("raise ValueError('boom')")
    assert result.status == "runtime_error" and result.exit_code == 1
    assert "ValueError: boom" in result.stderr


async def test_timeout_memory_and_output_limit() -> None:
    spin, mem, out = await asyncio.gather(
        sandbox.run("while True: pass", timeout=1),
        sandbox.run("x = bytearray(2 << 30)", memory_mb=256),
        sandbox.run("while True: print('y' * 4096)"),
    )
    assert spin.status == "timeout" and spin.exit_code is None and spin.duration < 3
    assert mem.status == "memory"
    assert out.status == "output_limit" and len(out.stdout) <= MIB


async def test_bash_language_and_unknown_language() -> None:
    result = await sandbox.run("echo $((6 * 7)); exit 3", language="bash")
    assert (result.status, result.exit_code, result.stdout) == ("runtime_error", 3, "42\n")
    with pytest.raises(ValueError, match="unsupported sandbox language"):
        await sandbox.run("x", language="cobol")


async def test_concurrency_limit_is_respected() -> None:
    before = runner.settings()
    sandbox.configure(concurrency=2)
    try:
        start = time.monotonic()
        results = await asyncio.gather(
            *(sandbox.run("import time; time.sleep(0.4)") for _ in range(4))
        )
        assert all(r.status == "ok" for r in results)
        assert time.monotonic() - start >= 0.8  # two waves of two
    finally:
        runner.use(before)


async def test_broken_sandbox_is_a_sandbox_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        launch_mod, "runtime_binds", lambda python: ["--ro-bind", "/nonexistent-rlkit", "/usr"]
    )
    result = await sandbox.run("print('never')")
    assert result.status == "sandbox_error"
    assert "nonexistent-rlkit" in result.stderr


async def test_local_backend_runs_with_limits() -> None:
    sandbox.configure(backend="local")
    try:
        ok, spin = await asyncio.gather(
            sandbox.run("import os; print(os.getcwd() != '/sandbox')"),
            sandbox.run("while True: pass", timeout=1),
        )
        assert (ok.status, ok.stdout) == ("ok", "True\n")
        assert spin.status == "timeout"
    finally:
        sandbox.configure(backend="bwrap")
    assert sandbox.active_backend().name == "bwrap"


async def test_python_session_keeps_state_and_recovers() -> None:
    async with PythonSession(timeout=2) as py:
        assert (await py.execute("x = 20")).status == "ok"
        assert (await py.execute("x + 22")).output == "42\n"
        failed = await py.execute("1 / 0")
        assert failed.status == "runtime_error" and "ZeroDivisionError" in failed.output
        assert (await py.execute("print(x)")).output == "20\n"  # an error keeps the state
        mixed = await py.execute("import os\nprint('a')\nos.system('echo b')\nprint('c')")
        assert mixed.output == "a\nb\nc\n"
        hung = await py.execute("import time; time.sleep(30)")
        assert hung.status == "timeout" and hung.restarted
        fresh = await py.execute("x")
        assert fresh.status == "runtime_error" and "NameError" in fresh.output
        assert (await py.execute("input()")).status == "runtime_error"  # stdin is not the pipe
    assert not py.alive


async def test_python_session_reports_a_broken_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        launch_mod, "runtime_binds", lambda python: ["--ro-bind", "/nonexistent-rlkit", "/usr"]
    )
    async with PythonSession() as py:
        result = await py.execute("print(1)")
    assert result.status == "sandbox_error"


async def test_unusable_bwrap_fails_closed_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "bwrap_self_test", lambda: "bwrap is not installed")
    runner.checked_backend.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
            await sandbox.run("print('never runs unisolated')")
        with pytest.raises(sandbox.SandboxUnavailable, match="RLKIT_SANDBOX_BACKEND=local"):
            sandbox.require()
    finally:
        monkeypatch.undo()
        runner.checked_backend.cache_clear()
    assert sandbox.active_backend().name == "bwrap"


async def test_mounts_bind_a_writable_workdir_and_read_only_import_roots(tmp_path) -> None:
    from rlkit.sandbox.launch import Mounts
    from rlkit.sandbox.runtime import runtime_tree
    from rlkit.sandbox.workspace import writable_copy

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "test_one.py").write_text("def test_one():\n    assert True\n")
    tree = runtime_tree("pytest")
    assert "pytest==" in (tree / "RUNTIME.txt").read_text()
    assert runtime_tree("pytest") == tree  # built once per set of versions
    with writable_copy(tmp_path / "src") as repo:
        mounts = Mounts(workdir=repo, pythonpath=(tree,))
        script = (
            "echo kept > made.txt\n"
            "touch /opt/pythonpath/0/x 2>/dev/null && echo runtime-writable\n"
            "touch /usr/x 2>/dev/null && echo usr-writable\n"
            "python3 -m pytest -q -p no:cacheprovider\n"
        )
        result = await sandbox.run(script, language="bash", mounts=mounts, timeout=30)
        assert result.status == "ok", result.stderr
        assert "1 passed" in result.stdout and "writable" not in result.stdout
        assert (repo / "made.txt").read_text() == "kept\n"  # the next run sees it
        again = await sandbox.run("cat made.txt", language="bash", mounts=mounts)
        assert again.stdout == "kept\n"
    assert not repo.exists()  # the copy is removed with everything the runs wrote


def test_explicit_local_backend_is_logged_at_every_run_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sandbox.configure(backend="local")
    try:
        with caplog.at_level("WARNING"):
            assert sandbox.require().name == "local"
            assert sandbox.require().name == "local"
        assert caplog.text.count("UNSAFE: the `local` sandbox backend was chosen") == 2
        with pytest.raises(ValueError, match="unknown sandbox backend 'auto'"):
            sandbox.configure(backend="auto")
    finally:
        sandbox.configure(backend="bwrap")


def test_rlkit_sandbox_check_reports_each_property(monkeypatch, capsys) -> None:
    from tests.helpers.cli import run_cli

    code, output = run_cli(monkeypatch, capsys, "sandbox", "check")
    assert code == 0, output
    for name in ("backend", "filesystem", "network", "processes", "user", "memory"):
        assert name in output
    assert "NO" not in output
    sandbox.configure(backend="local")  # no isolation: the check must say so and fail
    try:
        code, output = run_cli(monkeypatch, capsys, "sandbox", "check")
    finally:
        sandbox.configure(backend="bwrap")
    assert code == 1 and "NO" in output, output
    assert not Path("/usr/bin/rlkit-probe").exists()  # the unsandboxed probe cleaned up


async def test_a_warm_program_that_hides_a_marker_still_ends_soon() -> None:
    """A program that sends its stderr elsewhere: the host never sees that stream's marker and
    answers when the sandbox ends, which the loader does right after its markers."""
    pool = WarmPool(Profile(timeout=10.0, memory_mb=512), 1, runner.active_backend())
    sandbox = await pool.take()
    assert sandbox is not None
    code = "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 2)\nprint('hidden')"
    result = await sandbox.run(code, "python", "", {}, runner.limits(8.0, 256), 4096)
    assert (result.status, result.stdout, result.exit_code) == ("ok", "hidden\n", 0)
    assert result.duration < 4.0  # not the request's timeout
    await pool.close()


def test_settings_are_one_frozen_value_checked_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """SandboxSettings: from the environment, from [sandbox] over it, frozen, validated."""
    monkeypatch.setenv("RLKIT_SANDBOX_TOTAL_MEMORY_MB", "1024")
    monkeypatch.setenv("RLKIT_SANDBOX_URL", "")
    env = runner.SandboxSettings.from_env()
    assert env.total_memory_mb == 1024 and env.url is None
    assert env.limits(3.0, 256).total_memory_mb == 1024
    table = SandboxConfig(backend="local", url="http://x:1", token_file="/t")
    made = table.settings(env)
    assert (made.backend, made.total_memory_mb, made.url, made.token_file) == (
        "local", 1024, "http://x:1", "/t"
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.concurrency = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        runner.SandboxSettings(concurrency=0)
