"""`rlkit sandbox serve` through the path a user runs: the CLI subprocess, the `rlkit.sandbox`
API with `[sandbox] url`, raw HTTP from callers without (or with the wrong) credential, and
`rlkit train` starting one for its run (`[sandbox] serve`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlkit import sandbox
from rlkit.ports import free_port
from rlkit.sandbox import runner
from rlkit.sandbox.session import PythonSession
from tests.helpers.cli import tiny_train_cmd
from tests.helpers.sandbox_service import Service, sandbox_service
from tests.helpers.sandbox_service import marker as _marker
from tests.helpers.sandbox_service import pids_with as _pids_with
from tests.helpers.session_server import on_session_server
from tests.helpers.train_runs import SHORT, records, run

pytestmark = [pytest.mark.system, pytest.mark.slow]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("sandbox-service")
    args = ["--concurrency", "2", "--pool-size", "2", "--queue", "8", "--session-idle-s", "2"]
    args += ["--max-sessions-per-caller", "2"]
    with sandbox_service(folder, *args, "--tenant", "alice", "--tenant", "bob") as svc:
        yield svc


@pytest.fixture
def use_service(service: Service) -> Iterator[Service]:
    runner.configure(url=service.url, token_file=str(service.token_file))
    yield service
    runner.configure(url="")


async def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.1)


def test_every_route_but_health_needs_the_token(service: Service) -> None:
    assert httpx.get(f"{service.url}/health").status_code == 200
    wrong = {"Authorization": "Bearer " + "x" * 43}
    for method, path in [
        ("POST", "/run"),
        ("GET", "/metrics"),
        ("POST", "/sessions"),
        ("POST", "/sessions/abc/execute"),
        ("DELETE", "/sessions/abc"),
    ]:
        anonymous = httpx.request(method, service.url + path, json={"code": "print(1)"})
        assert anonymous.status_code == 401, path
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert httpx.request(method, service.url + path, headers=wrong).status_code == 403
    basic = {"Authorization": f"Basic {service.token}"}
    assert httpx.post(f"{service.url}/run", headers=basic, json={}).status_code == 401


async def test_programs_end_as_they_do_in_process(use_service: Service) -> None:
    cases = [
        dict(code="print(input()[::-1])", stdin="hello\n"),
        dict(code="import sys; sys.exit(3)"),
        dict(code="1/0"),
        dict(code="while True: pass", timeout=1.0),
        dict(code="x = bytearray(600 << 20)", memory_mb=256),
        dict(code="print('x' * 3_000_000)"),
        dict(code="print(open('data/in.bin', 'rb').read())", files={"data/in.bin": b"\x00\xff"}),
        dict(code="echo hi; cat", language="bash", stdin="there"),
        dict(code="import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"),
        # how a warm sandbox's program ends on its own (`loader.finish`), as an interpreter would
        dict(code="import sys; sys.exit('bye')"),
        dict(code="import atexit, sys; atexit.register(print, 'at exit'); sys.stdout.write('x')"),
        dict(code="import threading as t, time\nt.Thread(target=time.sleep, args=[0.3]).start()"),
    ]
    remote = [await sandbox.run(**case) for case in cases]
    runner.configure(url="")
    local = [await sandbox.run(**case) for case in cases]
    for case, got, want in zip(cases, remote, local, strict=True):
        assert (got.status, got.exit_code, got.stdout) == (want.status, want.exit_code, want.stdout)
        assert got.stderr.splitlines()[-1:] == want.stderr.splitlines()[-1:], case
    assert [r.status for r in remote[:6]] == [
        "ok",
        "runtime_error",
        "runtime_error",
        "timeout",
        "memory",
        "output_limit",
    ]
    assert remote[0].stdout == "olleh\n" and remote[6].stdout == "b'\\x00\\xff'\n"
    assert (remote[9].exit_code, remote[9].stderr) == (1, "bye\n")
    assert remote[10].stdout == "xat exit\n" and remote[11].status == "ok"
    assert "ZeroDivisionError" in remote[2].stderr and "main.py" in remote[2].stderr


async def test_requests_over_the_limits_are_refused(use_service: Service) -> None:
    with pytest.raises(ValueError, match="over the service's limits"):
        await sandbox.run("print(1)", timeout=600)
    with pytest.raises(ValueError, match="over the service's limits"):
        await sandbox.run("print(1)", memory_mb=4096)
    with pytest.raises(ValueError, match="body over the service's limit"):
        await sandbox.run("print(1)", files={"big": b"\x00" * (17 << 20)})
    with pytest.raises(ValueError, match="relative path"):
        await sandbox.run("print(1)", files={"../escape": "x"})
    headers = {"Authorization": f"Bearer {use_service.token}"}
    bad = httpx.post(f"{use_service.url}/run", headers=headers, content=b"\x80pickle")
    assert bad.status_code == 400
    extra = httpx.post(f"{use_service.url}/run", headers=headers, json={"code": "", "argv": []})
    assert extra.status_code == 400
    flood = httpx.post(
        f"{use_service.url}/sessions", headers=headers, json={"output_limit": 10**12}
    )
    assert flood.status_code == 400 and "output_limit 1000000000000 over" in flood.json()["error"]
    assert (await sandbox.run("print('still serving')")).stdout == "still serving\n"


async def test_a_sandbox_killed_mid_request_answers_and_the_service_goes_on(
    use_service: Service,
) -> None:
    marker = _marker()
    code = f"import subprocess; subprocess.run(['sleep', '{marker}'])"
    task = asyncio.ensure_future(sandbox.run(code, timeout=25))
    await _wait_for(lambda: bool(_pids_with(marker)))
    (sleeper,) = _pids_with(marker)
    sandboxes = [pid for pid in use_service.descendants() if _parent(pid) == use_service.proc.pid]
    (victim,) = [pid for pid in sandboxes if sleeper in _subtree(use_service, pid)]
    began = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    result = await asyncio.wait_for(task, 15)
    assert time.monotonic() - began < 10
    assert result.status != "ok" and result.exit_code != 0
    assert (await sandbox.run("print(7)")).stdout == "7\n"


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _subtree(service: Service, root: int) -> set[int]:
    found, todo = set(), [root]
    everyone = service.descendants()
    while todo:
        parent = todo.pop()
        for pid in everyone:
            if pid not in found and _parent(pid) == parent:
                found.add(pid)
                todo.append(pid)
    return found


async def test_a_burst_is_answered_in_full(service: Service) -> None:
    """Far more concurrent requests than slots and queue: each gets a result or a 429 with
    Retry-After, none is lost or left hanging."""
    headers = {"Authorization": f"Bearer {service.token}"}
    body = {"code": "import time; time.sleep(0.05); print('done')", "max_queue_s": 1.0}
    limits = httpx.Limits(max_connections=300)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=120) as client:
        answers = await asyncio.gather(
            *[client.post(f"{service.url}/run", json=body) for _ in range(300)]
        )
    codes = [a.status_code for a in answers]
    assert len(codes) == 300 and set(codes) <= {200, 429}
    assert codes.count(429) > 0 and codes.count(200) >= 2
    assert all(int(a.headers["retry-after"]) >= 1 for a in answers if a.status_code == 429)
    assert all(a.json()["stdout"] == "done\n" for a in answers if a.status_code == 200)
    metrics = service.metrics()
    assert metrics["rejected"] >= codes.count(429)
    assert metrics["running"] == 0 and metrics["waiting"] == 0
    assert metrics["pools"][0]["warm_starts"] > 0 and metrics["waits"] > 0


async def test_the_client_retries_a_busy_service(use_service: Service) -> None:
    results = await asyncio.gather(
        *[sandbox.run("import time; time.sleep(0.05); print(1)") for _ in range(40)]
    )
    assert [r.status for r in results] == ["ok"] * 40


async def test_sessions_keep_state_belong_to_their_caller_and_expire(
    use_service: Service,
) -> None:
    async with PythonSession() as py:
        assert (await py.execute("x = 41")).status == "ok"
        assert (await py.execute("x + 1")).output == "42\n"
        await asyncio.sleep(4.0)  # the service closes sessions idle for 2 s
        expired = await py.execute("x")
        assert expired.restarted and expired.status == "runtime_error"
        assert "NameError" in expired.output
        assert (await py.execute("y = 1; y")).output == "1\n"
    alice = {"Authorization": f"Bearer {use_service.tenant_file('alice').read_text().strip()}"}
    bob = {"Authorization": f"Bearer {use_service.tenant_file('bob').read_text().strip()}"}
    owner = {"Authorization": f"Bearer {use_service.token}"}
    async with httpx.AsyncClient(base_url=use_service.url, timeout=60) as client:
        opened = await client.post("/sessions", headers=alice, json={})
        sid = opened.json()["id"]
        cell = {"code": "secret = 'alice'"}
        assert (await client.post(f"/sessions/{sid}/execute", headers=alice, json=cell)).is_success
        for other in (bob, owner):
            peek = {"code": "secret"}
            answer = await client.post(f"/sessions/{sid}/execute", headers=other, json=peek)
            assert answer.status_code == 404 and "alice" not in answer.text
            assert (await client.delete(f"/sessions/{sid}", headers=other)).status_code == 404
        mine = await client.post(f"/sessions/{sid}/execute", headers=alice, json={"code": "secret"})
        assert mine.json()["output"] == "'alice'\n"
        # one caller cannot take every session: alice's third is refused, bob still gets his
        second = (await client.post("/sessions", headers=alice, json={})).json()["id"]
        third = await client.post("/sessions", headers=alice, json={})
        assert third.status_code == 429 and "limit per caller" in third.json()["error"]
        assert int(third.headers["retry-after"]) >= 1
        bobs = await client.post("/sessions", headers=bob, json={})
        assert bobs.status_code == 200
        for sid_, who in ((sid, alice), (second, alice), (bobs.json()["id"], bob)):
            assert (await client.delete(f"/sessions/{sid_}", headers=who)).status_code == 200
        again = await client.post("/sessions", headers=alice, json={})
        assert again.status_code == 200
        assert (await client.delete(f"/sessions/{again.json()['id']}", headers=alice)).is_success


async def test_a_service_killed_mid_run_errors_its_requests(tmp_path: Path) -> None:
    marker = _marker()
    with sandbox_service(tmp_path, "--pool-size", "1") as svc:
        runner.configure(url=svc.url, token_file=str(svc.token_file))
        try:
            session = PythonSession()
            assert (await session.execute("z = 1")).status == "ok"
            code = f"import subprocess; subprocess.run(['sleep', '{marker}'])"
            task = asyncio.ensure_future(sandbox.run(code, timeout=25))
            await _wait_for(lambda: bool(_pids_with(marker)))
            svc.proc.kill()
            began = time.monotonic()
            result = await asyncio.wait_for(task, 15)
            assert result.status == "sandbox_error" and "sandbox service" in result.stderr
            after = await sandbox.run("print(1)")
            assert after.status == "sandbox_error"
            cell = await session.execute("z")
            assert cell.status == "sandbox_error" and cell.restarted
            assert time.monotonic() - began < 10
            await session.close()
            # the sandboxes die with the service (bubblewrap's --die-with-parent)
            await _wait_for(lambda: not _pids_with(marker), timeout=10)
        finally:
            runner.configure(url="")


async def test_a_restarted_service_answers_the_clients_next_request(tmp_path: Path) -> None:
    """The client's kept connection to the service that stopped (closed by it, unread while the
    client's loop was blocked) is not used: the first program sent to the service started again
    on the same port runs instead of erroring its rollout."""
    port = free_port()
    runner.configure(url=f"http://127.0.0.1:{port}", token_file=str(tmp_path / "sandbox.token"))
    try:
        with sandbox_service(tmp_path, "--pool-size", "1", port=port):
            assert (await sandbox.run("print(1)")).stdout == "1\n"
            assert (await sandbox.run("print(2)")).stdout == "2\n"  # on the kept connection
        with sandbox_service(tmp_path, "--pool-size", "1", port=port):
            after = await sandbox.run("print(3)")
            assert after.status == "ok" and after.stdout == "3\n", after.stderr
    finally:
        runner.configure(url="")


def test_rlkit_train_starts_one_sandbox_service_for_the_run(
    vllm_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`[sandbox] serve = true`: every reward's program runs in the one service the run started
    (its summary says so), which stops with the run; its token file is the run's, mode 0600."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    with on_session_server(vllm_server, tiny_model_dir) as urls:
        cmd = tiny_train_cmd(
            tiny_model_dir,
            run_dir,
            *SHORT,
            *urls,
            "--env.0.id=sandboxed-reverse",
            "--env.0.args={n = 20}",
            "--sandbox.serve=true",
            '--sandbox.serve_args=["--concurrency", "2", "--pool-size", "2"]',
        )
        code = run(cmd, log, timeout=600)
    text = " ".join(log.read_text().split())  # rich wraps long lines
    assert code == 0, text[-3000:]
    assert "sandbox service at http://127.0.0.1:" in text
    summary = re.search(r"sandbox service: (\d+) programs, .*?(\d+) sandbox errors", text)
    assert summary is not None, text[-3000:]
    trained = sum(r["batch_samples"] for r in records(run_dir))
    assert int(summary[1]) >= trained > 0 and int(summary[2]) == 0
    pid = json.loads((run_dir / "pids.json").read_text())["sandbox"][0]
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped with the run
    assert stat.S_IMODE((run_dir / "sandbox.token").stat().st_mode) == 0o600


async def test_the_service_runs_under_the_settings_it_was_given(tmp_path: Path) -> None:
    """Issue 62: a service's sandbox settings are passed in, not read from the process: with
    the process pointed at a dead service and its default output cap, the service's own runs
    and sessions still run here, under the output cap it was given."""
    from dataclasses import replace

    from rlkit.sandbox.service import SandboxService, ServiceSettings
    from rlkit.sandbox.wire import CellRequest, RunRequest, SessionRequest

    token_file = tmp_path / "token"
    token_file.write_text("t" * 32)
    token_file.chmod(0o600)
    before = runner.use(
        replace(runner.settings(), url="http://127.0.0.1:9", token_file=str(token_file))
    )
    given = replace(runner.SandboxSettings(), output_limit=100)
    service = SandboxService(ServiceSettings(pool_size=1, fork_server=False, sandbox=given))
    try:
        await service.start()
        ran = await service.run(RunRequest(code="print('x' * 1000)"))
        assert ran["status"] == "output_limit" and len(ran["stdout"]) <= 100
        refused = SessionRequest(output_limit=200)
        with pytest.raises(Exception, match="over the service's limit of 100 bytes"):
            service.open_session(refused, "owner")
        opened = service.open_session(SessionRequest(output_limit=50), "owner")
        cell = await service.execute(opened["id"], CellRequest(code="print(6 * 7)"), "owner")
        assert cell["status"] == "ok" and "42" in cell["output"], cell
    finally:
        await service.stop()
        runner.use(before)
