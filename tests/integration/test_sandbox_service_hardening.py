"""`rlkit sandbox serve` tried as a caller who wishes it harm (issue 64): a service started as
the README says (the CLI subprocess), raw HTTP and sockets, and the host's /proc looked at from
outside. Each test failed on the code before the fix it names."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlkit import sandbox
from rlkit.sandbox import runner
from rlkit.sandbox.launch import UID_BASE
from rlkit.sandbox.limits import SHM_MB
from rlkit.serving import HEADER_TIMEOUT_S, MAX_HEADER_BYTES
from tests.helpers.sandbox_service import Service, sandbox_service, shm_left
from tests.helpers.sandbox_service import marker as _marker
from tests.helpers.sandbox_service import pids_with as _cmdlines_with

pytestmark = [pytest.mark.system, pytest.mark.slow]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("sandbox-hardening")
    args = ["--concurrency", "2", "--pool-size", "2", "--session-idle-s", "2"]
    with sandbox_service(folder, *args) as svc:
        yield svc


def _auth(service: Service) -> dict[str, str]:
    return {"Authorization": f"Bearer {service.token}"}


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _footprint(service: Service) -> tuple[int, int, int]:
    """The service's processes under it, its open descriptors and its resident memory (KiB)."""
    pid = service.proc.pid
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return len(service.descendants()), len(os.listdir(f"/proc/{pid}/fd")), rss


def test_tmpfs_writes_stay_inside_the_memory_cap(service: Service) -> None:
    """/dev/shm was bubblewrap's size-less --dev tmpfs: 2.3 GB written with memory_mb = 64."""
    code = """
import os
written = {}
for folder in ("/dev/shm", "/dev", "/tmp"):
    written[folder] = 0
    for i in range(40):  # 40 x 8 MiB = 320 MiB per folder if nothing stops it
        try:
            with open(f"{folder}/f{i}", "wb") as f:
                f.write(b"x" * (8 << 20))
            written[folder] += 8
        except OSError:
            break
print(written)
"""
    answer = httpx.post(
        f"{service.url}/run",
        headers=_auth(service),
        json={"code": code, "memory_mb": 64, "timeout": 20},
        timeout=60,
    ).json()
    assert answer["status"] == "ok", answer
    written = eval(answer["stdout"])
    assert written["/dev/shm"] <= SHM_MB and written["/dev"] == 0 and written["/tmp"] <= 64


def test_a_refused_request_frees_its_sandbox(service: Service) -> None:
    """A /run refused for a bad file name left its warm sandbox alive for good."""
    _wait_for(lambda: sum(p["ready"] for p in service.metrics()["pools"]) == 2)
    before = len(service.descendants())
    for name in ("../escape", "a\x00b", "/abs", "x" * 5000):
        body = {"code": "print(1)", "files": {name: base64.b64encode(b"x").decode()}}
        answer = httpx.post(f"{service.url}/run", headers=_auth(service), json=body, timeout=30)
        assert answer.status_code == 400, answer.text
    assert _wait_for(lambda: len(service.descendants()) <= before, timeout=5), (
        before,
        service.descendants(),
    )


def test_sessions_refuse_bad_names_and_cpu_over_the_cap(service: Service) -> None:
    """Bad file names in a session were a 500 (and a reset); lifetime_cpu_s took any value."""
    headers = _auth(service)
    bad = {"files": {"../x": base64.b64encode(b"x").decode()}}
    opened = httpx.post(f"{service.url}/sessions", headers=headers, json=bad, timeout=30)
    assert opened.status_code == 400 and "file name" in opened.json()["error"]
    greedy = httpx.post(
        f"{service.url}/sessions", headers=headers, json={"lifetime_cpu_s": 1e9}, timeout=30
    )
    assert greedy.status_code == 400 and "lifetime_cpu_s" in greedy.json()["error"]


def test_a_cells_background_child_ends_with_the_cell(service: Service) -> None:
    marker = _marker()
    with httpx.Client(base_url=service.url, headers=_auth(service), timeout=60) as client:
        sid = client.post("/sessions", json={}).json()["id"]
        try:
            cell = {"code": f"import subprocess; p = subprocess.Popen(['sleep', '{marker}'])"}
            assert client.post(f"/sessions/{sid}/execute", json=cell).json()["status"] == "ok"
            assert _wait_for(lambda: not _cmdlines_with(marker), timeout=3)
            ended = {"code": "p.poll() is not None"}  # the session lives on, its child does not
            assert client.post(f"/sessions/{sid}/execute", json=ended).json()["output"] == "True\n"
        finally:
            client.delete(f"/sessions/{sid}")


def test_a_sessions_stderr_is_not_kept_on_the_service(service: Service) -> None:
    """Each session writing to its interpreter's stderr grew the service by ~10 MB."""
    spam = """
import os, threading, time
def spam():
    time.sleep(0.2)
    for _ in range(40):
        os.write(2, b"e" * (1 << 20))
threading.Thread(target=spam).start()
"""
    with httpx.Client(base_url=service.url, headers=_auth(service), timeout=60) as client:
        opened = client.post("/sessions", json={"output_limit": 1 << 20}).json()
        sid = opened["id"]
        try:
            assert client.post(f"/sessions/{sid}/execute", json={"code": "1"}).is_success
            rss_before = _footprint(service)[2]
            assert client.post(f"/sessions/{sid}/execute", json={"code": spam}).is_success
            time.sleep(1.5)  # within the service's idle expiry (2 s)
            assert client.post(f"/sessions/{sid}/execute", json={"code": "2"}).is_success
            assert _footprint(service)[2] - rss_before < 4096  # KiB
        finally:
            client.delete(f"/sessions/{sid}")


def test_no_request_data_on_host_command_lines(service: Service) -> None:
    """File names (a hidden test's) were bubblewrap arguments, readable by every host user."""
    secret = f"hidden_test_{_marker().replace('.', '_')}.py"
    files = {secret: base64.b64encode(b"assert True").decode()}
    with httpx.Client(base_url=service.url, headers=_auth(service), timeout=60) as client:
        sid = client.post("/sessions", json={"files": files}).json()["id"]
        try:
            cell = {"code": f"import os; sorted(os.listdir('.')) == [{secret!r}]"}
            assert client.post(f"/sessions/{sid}/execute", json=cell).json()["output"] == "True\n"
            assert _cmdlines_with(secret) == []
        finally:
            client.delete(f"/sessions/{sid}")


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox needs root (README)")
def test_each_sandbox_runs_as_a_uid_of_its_own(service: Service) -> None:
    """Every sandbox ran as `nobody`: whatever else ran as that uid could read them all."""
    _wait_for(lambda: sum(p["ready"] for p in service.metrics()["pools"]) == 2)
    uids = []
    for pid in service.descendants():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if _parent(pid) == service.proc.pid:
            uids.append(
                int(next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1])
            )
    assert len(uids) >= 2 and len(set(uids)) == len(uids) and min(uids) >= UID_BASE


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox needs root (README)")
def test_a_sandboxs_uid_cannot_read_another_sandboxs_memory(service: Service) -> None:
    """The barrier between tenants: whatever runs as one sandbox's host uid (an escape from it)
    is refused another sandbox's /proc/PID/environ and /proc/PID/mem; the same uid reads its
    own (what one uid shared by every sandbox, as before, exposed to all)."""
    assert _wait_for(lambda: sum(p["ready"] for p in service.metrics()["pools"]) == 2)
    deepest: dict[int, tuple[int, int]] = {}  # uid -> (pid namespace depth, pid)
    for pid in service.descendants():
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        uid = int(next(x for x in lines if x.startswith("Uid:")).split()[1])
        depth = len(next(x for x in lines if x.startswith("NSpid:")).split())
        if uid >= UID_BASE and depth >= deepest.get(uid, (0, 0))[0]:
            deepest[uid] = (depth, pid)  # a warm sandbox's loader, in its own pid namespace
    assert len(deepest) >= 2, deepest
    (uid_a, (_, pid_a)), (uid_b, (_, pid_b)) = list(deepest.items())[:2]

    def read_as(uid: int, path: str) -> subprocess.CompletedProcess:
        as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return subprocess.run([*as_uid, "cat", path], capture_output=True, timeout=10)

    for path in (f"/proc/{pid_b}/environ", f"/proc/{pid_b}/mem"):
        other = read_as(uid_a, path)
        assert other.returncode != 0 and b"Permission denied" in other.stderr, other
        assert not other.stdout
    own = read_as(uid_b, f"/proc/{pid_b}/environ")
    assert own.returncode == 0 and b"PATH=" in own.stdout, own
    assert read_as(uid_b, f"/proc/{pid_a}/environ").returncode != 0


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _host_port(service: Service) -> tuple[str, int]:
    host, port = service.url.removeprefix("http://").split(":")
    return host, int(port)


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the peer closes `sock` within `within` seconds (whatever it sent first)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def test_connections_without_a_token_are_bounded(service: Service) -> None:
    """Idle or trickling connections were held with no timeout, headers of any size were read
    before the 401, and a body was read (and discarded) after it."""
    address = _host_port(service)
    idle = socket.create_connection(address)
    trickle = socket.create_connection(address)
    trickle.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\n")
    huge = socket.create_connection(address)
    huge.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (4 * MAX_HEADER_BYTES))
    assert _closed(huge, 5.0)
    body = socket.create_connection(address)
    body.sendall(
        b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 1024
    )
    body.settimeout(5.0)
    assert body.recv(65536).startswith(b"HTTP/1.1 401")
    assert _closed(body, 5.0)
    began = time.monotonic()
    for _ in range(3):
        trickle.sendall(b"X-A: b\r\n")  # a header line now and then never completes the request
        time.sleep(1.0)
    assert _closed(idle, HEADER_TIMEOUT_S + 5 - (time.monotonic() - began))
    assert _closed(trickle, 5.0)
    for sock in (idle, trickle, huge, body):
        sock.close()
    assert httpx.get(f"{service.url}/health", timeout=5).status_code == 200


def _client_script(service: Service, code: str, session: bool) -> list[str]:
    work = (
        f"PythonSession(timeout=25).execute({code!r})"
        if session
        else f"sandbox.run({code!r}, timeout=25)"
    )
    program = f"""
import asyncio
from rlkit import sandbox
from rlkit.sandbox.session import PythonSession
sandbox.configure(url={service.url!r}, token_file={str(service.token_file)!r})
asyncio.run({work})
"""
    return [sys.executable, "-c", program]


def test_nothing_is_left_when_a_client_or_the_service_is_killed(
    tmp_path: Path, service: Service
) -> None:
    """A SIGKILLed client's program ran on to its timeout; its session to its idle expiry.
    Processes, descriptors and memory of the service are counted before and after each kill."""
    _wait_for(lambda: sum(p["ready"] for p in service.metrics()["pools"]) == 2)
    time.sleep(0.5)
    before = _footprint(service)
    for session in (False, True):
        marker = _marker()
        head, tail = marker.split(".")  # joined in the sandbox: not on the client's command line
        code = f"import subprocess; subprocess.run(['sleep', '{head}' + '.{tail}'])"
        client = subprocess.Popen(_client_script(service, code, session))
        assert _wait_for(lambda m=marker: bool(_cmdlines_with(m)), timeout=30)
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert _wait_for(lambda m=marker: not _cmdlines_with(m), timeout=8), session
    assert _wait_for(lambda: service.metrics()["sessions"] == 0, timeout=10)
    assert _wait_for(lambda: sum(p["ready"] for p in service.metrics()["pools"]) == 2)

    def back_to(before: tuple[int, int, int]) -> bool:
        processes, fds, rss = _footprint(service)
        return processes <= before[0] and fds <= before[1] + 2 and rss - before[2] < 20 << 10

    assert _wait_for(lambda: back_to(before), timeout=10), (before, _footprint(service))
    # the service itself SIGKILLed: every sandbox and its tmpfs go with it
    shm_before = set(os.listdir("/dev/shm"))
    with sandbox_service(tmp_path, "--pool-size", "2") as other:
        marker = _marker()
        runner.configure(url=other.url, token_file=str(other.token_file))
        try:
            code = (
                f"import subprocess; open('/dev/shm/{marker}', 'w').write('x' * 4096); "
                f"subprocess.run(['sleep', '{marker}'])"
            )
            task = asyncio.run(_start_and_kill(other, code, marker))
        finally:
            runner.configure(url="")
        assert task.status == "sandbox_error"
        assert _wait_for(lambda: not other.descendants() and not _cmdlines_with(marker), 10)
    # what the sandbox wrote to its /dev/shm is not on the host's
    assert not shm_left(shm_before) and not Path(f"/dev/shm/{marker}").exists()


async def _start_and_kill(service: Service, code: str, marker: str):
    task = asyncio.ensure_future(sandbox.run(code, timeout=25))
    while not _cmdlines_with(marker):
        await asyncio.sleep(0.1)
    descendants = service.descendants()
    service.proc.kill()
    result = await asyncio.wait_for(task, 15)
    _wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in descendants), 10)
    return result
