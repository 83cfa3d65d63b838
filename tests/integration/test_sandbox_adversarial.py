"""Adversarial programs against rlkit.sandbox: each is contained, leaves the host untouched and
gets a classified result. Processes are recognised on the host by a unique `sleep` duration."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit import sandbox
from rlkit.sandbox import backends, rootfs
from tests.helpers.system import require_system

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _bwrap_backend() -> None:
    problem = backends.Bwrap().problem()
    require_system("bubblewrap", problem is None, str(problem))


def _marker() -> str:
    """A `sleep` argument no other process on the host uses."""
    return f"{random.randint(10**6, 10**7)}.{random.randint(10**5, 10**6)}"


def _host_processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture
def listening_port() -> Iterator[tuple[int, list[str]]]:
    """A TCP server on the host's 127.0.0.1; records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            accepted.append(str(addr))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


async def test_reading_host_files_fails() -> None:
    code = f"""
import os
for path in [{str(REPO / "pyproject.toml")!r}, "/root/.bashrc", "/etc/shadow", "/etc/passwd",
             "/home", "/work", "/proc/1/root/etc/shadow"]:
    try:
        data = open(path).read() if not os.path.isdir(path) else os.listdir(path)
        print("READ", path)
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
print(sorted(os.listdir("/")))
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    assert "READ" not in result.stdout
    assert result.stdout.count("DENIED") == 7
    assert "'root'" not in result.stdout and "'work'" not in result.stdout


async def test_writing_outside_the_workdir_leaves_host_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    code = f"""
for path in [{str(victim)!r}, "/usr/evil.txt", "/etc/evil.txt", "/evil.txt", "/proc/evil"]:
    try:
        open(path, "w").write("pwned")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
open("/tmp/scratch.txt", "w").write("private tmpfs is fine")
open("ok.txt", "w").write("workdir is fine")
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("DENIED") == 5
    assert victim.read_text() == "original"
    assert not Path("/usr/evil.txt").exists() and not Path("/evil.txt").exists()


async def test_no_network_to_localhost_or_outside(listening_port: tuple[int, list[str]]) -> None:
    port, accepted = listening_port
    code = f"""
import socket
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("CONNECTED", host)
    except OSError as exc:
        print("BLOCKED", host, type(exc).__name__)
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    assert "CONNECTED" not in result.stdout and result.stdout.count("BLOCKED") == 3
    assert accepted == []


async def test_fork_bomb_is_bounded_and_killed() -> None:
    marker = _marker()
    code = f"""
import os
while True:
    try:
        os.fork()
    except OSError:
        os.execvp("sleep", ["sleep", "{marker}"])
"""
    result = await sandbox.run(code, timeout=3)
    assert result.status == "timeout"
    assert _host_processes_with(marker) == []


async def test_process_limit_applies_inside() -> None:
    code = """
import os, time
children = 0
for _ in range(500):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        children += 1
    except OSError:
        break
print(children)
"""
    result = await sandbox.run(code, timeout=8)
    assert result.status == "ok", result.stderr
    assert 0 < int(result.stdout) < 64


async def test_memory_bomb() -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))"
    result = await sandbox.run(code, memory_mb=256)
    assert result.status == "memory"


async def test_cpu_spin_and_sleep_forever_time_out() -> None:
    spin = await sandbox.run("while True: pass", timeout=1)
    sleeper = await sandbox.run("import time; time.sleep(10**6)", timeout=1)
    assert spin.status == sleeper.status == "timeout"
    assert spin.duration < 3 and sleeper.duration < 3


async def test_huge_output_is_capped() -> None:
    result = await sandbox.run("import sys\nwhile True: sys.stdout.write('z' * 65536)")
    assert result.status == "output_limit"
    assert 0 < len(result.stdout) <= 2**20


async def test_signalling_the_parent_and_everyone_stays_inside() -> None:
    bystander = subprocess.Popen(["sleep", _marker()])
    code = """
import os, signal
print("parent", os.getppid(), flush=True)
os.kill(-1, signal.SIGKILL)
os.kill(os.getppid(), signal.SIGKILL)
print("survived")
"""
    try:
        result = await sandbox.run(code)
        assert result.status in ("ok", "memory", "runtime_error")  # killed itself at worst
        assert "parent 1" in result.stdout  # its parent is the sandbox's own init
        assert bystander.poll() is None  # the host process was out of reach
    finally:
        bystander.kill()
        bystander.wait()


async def test_host_environment_secrets_do_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"rlkit-fake-secret-{_marker()}"
    monkeypatch.setenv("RLKIT_FAKE_API_KEY", secret)
    code = """
import os
print(dict(os.environ))
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            print(open(f"/proc/{pid}/environ", "rb").read())
        except OSError:
            pass
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    assert secret not in result.stdout and "RLKIT_FAKE_API_KEY" not in result.stdout
    assert "HOME': '/sandbox'" in result.stdout


async def test_proc_shows_only_sandbox_processes() -> None:
    code = """
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print(len(pids))
for p in pids:
    print(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    count, *cmdlines = result.stdout.splitlines()
    assert int(count) <= 3  # bwrap's init, prlimit-exec'd python, nothing of the host
    assert not any("pytest" in c or "vllm" in c for c in cmdlines)


async def test_symlink_escape() -> None:
    code = f"""
import os
os.symlink({str(REPO / "pyproject.toml")!r}, "link_checkout")
os.symlink("/root", "link_root")
os.symlink("/proc/1/root/etc/hostname", "link_proc")
for link in ["link_checkout", "link_root", "link_proc"]:
    try:
        os.listdir(link) if link == "link_root" else open(link).read()
        print("ESCAPED", link)
    except OSError as exc:
        print("CONTAINED", link, type(exc).__name__)
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    assert "ESCAPED" not in result.stdout and result.stdout.count("CONTAINED") == 3


async def test_background_process_does_not_outlive_the_run() -> None:
    marker = _marker()
    code = f"""
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{marker}"])
    os._exit(0)
print("main done")
"""
    result = await sandbox.run(code)
    assert (result.status, result.stdout) == ("ok", "main done\n")
    assert _host_processes_with(marker) == []


async def test_timed_out_program_leaves_no_process() -> None:
    marker = _marker()
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\nwhile True: pass"
    result = await sandbox.run(code, timeout=1)
    assert result.status == "timeout"
    assert _host_processes_with(marker) == []


async def test_tampering_with_the_checkout_changes_nothing() -> None:
    target = REPO / "pyproject.toml"
    before = (hashlib.sha256(target.read_bytes()).hexdigest(), target.stat().st_mtime_ns)
    code = f"""
import os, shutil
path = {str(target)!r}
for attempt in (lambda: open(path, "a").write("pwned"), lambda: os.remove(path),
                lambda: os.chmod(path, 0o777), lambda: shutil.rmtree(os.path.dirname(path))):
    try:
        attempt()
        print("CHANGED")
    except OSError as exc:
        print("DENIED", type(exc).__name__)
"""
    result = await sandbox.run(code)
    assert result.status == "ok", result.stderr
    assert "CHANGED" not in result.stdout and result.stdout.count("DENIED") == 4
    after = (hashlib.sha256(target.read_bytes()).hexdigest(), target.stat().st_mtime_ns)
    assert after == before


@pytest.fixture
def planted_grader_data() -> Iterator[str]:
    """A grader's expected-output file installed the way a system or container Python install
    puts environment data: inside the interpreter's site-packages (when this user may write
    there; the checkout's own copy of the code env's data is searched for either way)."""
    secret = f"rlkit-grader-expected-output-{_marker()}"
    site = Path(rootfs.interpreter_paths(rootfs.sandbox_python())["purelib"])
    planted = site / f"rlkit_grader_probe_{_marker().replace('.', '_')}"
    try:
        (planted / "data").mkdir(parents=True)
        (planted / "data" / "problems.jsonl").write_text(json.dumps({"output": secret}) + "\n")
    except OSError:
        planted = None
    try:
        yield secret
    finally:
        if planted is not None:
            shutil.rmtree(planted, ignore_errors=True)


async def test_grader_data_and_site_packages_are_not_visible(planted_grader_data: str) -> None:
    """A reward hacker searches every file it can see for the graders' expected outputs."""
    problems = REPO / "environments/code/code_env/data/problems.jsonl"
    line = problems.read_text().splitlines()[0]
    needles = [planted_grader_data, line[len(line) // 2 : len(line) // 2 + 64]]
    # Reversed in the program text, so the program file itself does not contain them.
    code = f"""
import os
needles = [n[::-1].encode() for n in {[n[::-1] for n in needles]!r}]
suspicious = ("site-packages", "dist-packages", "code_env", "rlkit")
found, named, files = [], [], 0
for root, dirs, names in os.walk("/", followlinks=False):
    if root in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    named += [os.path.join(root, n) for n in dirs + names if any(s in n for s in suspicious)]
    for name in names:
        path = os.path.join(root, name)
        try:
            if os.path.islink(path) or os.path.getsize(path) > 8 << 20:
                continue
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        files += 1
        found += [path for n in needles if n in data]
print("FILES", files)
print("FOUND", found)
print("NAMED", named)
"""
    result = await sandbox.run(code, timeout=120)
    assert result.status == "ok", result.stderr
    assert int(result.stdout.split("FILES ")[1].split()[0]) > 100  # it really searched
    assert "FOUND []" in result.stdout
    assert "NAMED []" in result.stdout
    for hidden in rootfs.hidden_paths(rootfs.sandbox_python()):
        assert hidden not in result.stdout


async def test_memory_across_many_processes_stops_at_the_total_cap() -> None:
    """Each child stays under the per-process limit; together they would far exceed the cap."""
    sandbox.configure(total_memory_mb=512)
    code = """
import os, time
held = 0
for _ in range(16):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            block = bytearray(80 << 20)
            block[::4096] = b"x" * len(block[::4096])  # touch every page
            os.write(1, b"HELD\\n")
            time.sleep(30)
        except MemoryError:
            os.write(1, b"REFUSED\\n")
        os._exit(0)
    held += 1
    time.sleep(0.2)
print("FORKED", held, flush=True)
"""
    try:
        result = await sandbox.run(code, memory_mb=128, timeout=15)
    finally:
        sandbox.configure(total_memory_mb=2048)
    assert result.status == "ok", result.stderr
    held = result.stdout.count("HELD")
    forked = int(result.stdout.split("FORKED ")[1].split()[0])
    assert 1 <= held <= forked < 16  # fork was refused long before 16 children
    # Every process in the tree maps at most 128 MiB and at most 512 // 128 of them exist.
    assert (forked + 1) * 128 <= 512
