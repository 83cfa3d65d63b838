"""The sandbox service's parts that need no bubblewrap: admission (limit, bounded queue,
Retry-After), configuration, wire encoding, and a client whose service is not there, restarts
or dies mid-request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError

from rlkit import sandbox
from rlkit.errors import UsageError
from rlkit.ports import free_port
from rlkit.protocol.credentials import write_token_file
from rlkit.sandbox import runner
from rlkit.sandbox.client import SandboxClient
from rlkit.sandbox.config import SandboxConfig
from rlkit.sandbox.pool import Profile
from rlkit.sandbox.process import _CappedReader, end_prefix
from rlkit.sandbox.service import Admission, Busy
from rlkit.sandbox.session import PythonSession
from rlkit.sandbox.wire import decode_files, encode_files
from tests.helpers.threaded_service import Handler, ThreadedService


async def test_admission_runs_the_limit_queues_the_rest_and_refuses_beyond() -> None:
    admission = Admission(concurrency=1, queue=1)
    release = asyncio.Event()

    async def hold() -> None:
        async with admission.slot(10):
            await release.wait()

    holder = asyncio.ensure_future(hold())
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(hold())
    await asyncio.sleep(0)
    assert admission.running == 1 and admission.waiting == 1
    with pytest.raises(Busy) as busy:
        async with admission.slot(10):
            pass
    assert busy.value.retry_after >= 1
    release.set()
    await asyncio.gather(holder, waiter)
    assert admission.running == 0 and admission.waiting == 0
    assert admission.rejected == 1 and admission.waits == 1


async def test_admission_gives_up_after_the_callers_wait() -> None:
    admission = Admission(concurrency=1, queue=10)
    async with admission.slot(1):
        with pytest.raises(Busy):
            async with admission.slot(0.05):
                pass
    assert admission.waiting == 0 and admission.rejected == 1


def test_a_profile_covers_requests_up_to_its_limits() -> None:
    profile = Profile(timeout=30, memory_mb=512)
    assert profile.covers(30, 512) and profile.covers(1, 64)
    assert not profile.covers(31, 512) and not profile.covers(1, 513)


def test_files_travel_as_base64_and_garbage_is_refused() -> None:
    files = {"a.txt": "héllo", "b.bin": b"\x00\xff"}
    assert decode_files(encode_files(files)) == {"a.txt": "héllo".encode(), "b.bin": b"\x00\xff"}
    with pytest.raises(ValueError, match="not base64"):
        decode_files({"a": "!!not base64!!"})


def test_a_service_url_needs_its_token_file() -> None:
    with pytest.raises(ValidationError, match="sandbox.token_file"):
        SandboxConfig(url="http://127.0.0.1:8790")
    with pytest.raises(ValueError, match="token_file"):
        runner.configure(url="http://127.0.0.1:8790")
    assert runner.service() is None


def test_serve_starts_a_service_of_its_own_and_only_for_train(tmp_path: Path) -> None:
    """`[sandbox] serve` and a `url` contradict each other; eval refuses serve, naming the fix
    (nothing is loaded or written)."""
    from rlkit.eval import EvalConfig, run_eval

    token_file = tmp_path / "token"
    with pytest.raises(ValidationError, match="leave sandbox.url unset"):
        SandboxConfig(serve=True, url="http://127.0.0.1:8790", token_file=str(token_file))
    config = EvalConfig(
        env_id="reverse-text", model="m", output_dir=tmp_path / "out", sandbox={"serve": True}
    )
    with pytest.raises(UsageError, match="rlkit sandbox serve"):
        run_eval(config)
    assert not (tmp_path / "out").exists()


async def test_an_unreachable_service_is_a_sandbox_error_not_a_hang(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    write_token_file(token_file)
    SandboxConfig(url=f"http://127.0.0.1:{free_port()}", token_file=str(token_file)).apply()
    try:
        result = await asyncio.wait_for(sandbox.run("print(1)"), 30)
        assert result.status == "sandbox_error" and "Cannot connect to host" in result.stderr
        cell = await asyncio.wait_for(PythonSession().execute("1"), 30)
        assert cell.status == "sandbox_error" and cell.restarted
        assert sandbox.require() is None  # the service checks its own backend
    finally:
        runner.configure(url="")


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    write_token_file(token_file)
    token_file.chmod(0o644)
    runner.configure(url="http://127.0.0.1:1", token_file=str(token_file))
    try:
        with pytest.raises(Exception, match="readable or writable by other users"):
            runner.service()
    finally:
        runner.configure(url="")


def test_the_client_keeps_one_connection_per_event_loop_and_closes_it_with_the_loop(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    write_token_file(token_file)
    client = SandboxClient(f"http://127.0.0.1:{free_port()}", str(token_file))
    peers: list[tuple[str, int]] = []

    async def answer(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.json_response({"ok": True})

    async def calls() -> aiohttp.ClientSession:
        app = web.Application()
        app.router.add_get("/metrics", answer)
        runner_ = web.AppRunner(app)
        await runner_.setup()
        port = int(client.url.rsplit(":", 1)[1])
        await web.TCPSite(runner_, "127.0.0.1", port).start()
        try:
            for _ in range(3):
                assert await client.call("GET", "/metrics", None, 1.0) == {"ok": True}
            return await client._session()
        finally:
            await runner_.cleanup()

    first = asyncio.run(calls())
    assert first.closed and not client._sessions  # closed when its loop shut down
    second = asyncio.run(calls())
    assert second is not first and second.closed
    assert len(set(peers[:3])) == 1 and len(set(peers[3:])) == 1  # one connection a loop


@contextmanager
def threaded_client(
    tmp_path: Path, handler: Handler
) -> Iterator[tuple[ThreadedService, SandboxClient, Callable[[], sandbox.SandboxResult]]]:
    """A running stand-in service, a client of it, and a `/run` through that client on one event
    loop kept between calls (so its session and kept connection are too)."""
    token_file = tmp_path / "token"
    write_token_file(token_file)
    service = ThreadedService(free_port(), handler)
    service.start()
    client = SandboxClient(f"http://127.0.0.1:{service.port}", str(token_file))
    loop = asyncio.new_event_loop()

    def run() -> sandbox.SandboxResult:
        return loop.run_until_complete(client.run("print(1)", "python", "", 5.0, 256, None))

    try:
        yield service, client, run
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())  # closes the client's session
        loop.close()
        service.close()


def _answer(peers: list[Any]) -> Handler:
    async def answer(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.json_response({"status": "ok", "stdout": "1\n", "exit_code": 0})

    return answer


def test_a_restarted_service_gets_the_next_request_on_a_new_connection(tmp_path: Path) -> None:
    """The kept connection the old service closed is not used: the request after the restart
    succeeds instead of erroring its rollout."""
    peers: list[Any] = []
    with threaded_client(tmp_path, _answer(peers)) as (service, _, run):
        assert run().status == "ok"
        assert run().status == "ok"
        service.stop()
        service.start()  # the same port, the client's loop idle meanwhile
        after = run()
        assert after.status == "ok", after.stderr
        assert len(peers) == 3 and peers[0] == peers[1] != peers[2]


def test_a_request_the_service_received_is_not_sent_again(tmp_path: Path) -> None:
    """A service that dies holding a request on a kept connection, before its first answer byte
    or mid-answer, errors that request (it may have run the program): it is not sent twice."""
    received: list[int] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        received.append(len(received) + 1)
        if len(received) == 2:  # dies before answering
            request.transport.abort()
            return web.Response()
        if len(received) == 4:  # dies mid-answer
            reply = web.StreamResponse(headers={"Content-Length": "100"})
            reply.content_type = "application/json"
            await reply.prepare(request)
            await reply.write(b'{"status": "o')
            request.transport.abort()
            return reply
        return web.json_response({"status": "ok", "exit_code": 0})

    with threaded_client(tmp_path, answer) as (_, _, run):
        for expected in ("ok", "sandbox_error", "ok", "sandbox_error", "ok"):
            result = run()
            assert result.status == expected, result.stderr
            if expected == "sandbox_error":
                assert result.stderr.startswith("sandbox service")
        assert received == [1, 2, 3, 4, 5]  # each request once


@pytest.mark.parametrize(
    ("chunks", "code", "kept"),
    [
        ([b"out", b"put\n\x00rlkit-end:ab12:7\n"], 7, b"output\n"),  # split across reads
        ([b"x\x00rlkit-end:ab1", b"2:0\n"], 0, b"x"),  # the marker itself split
        ([b"\x00rlkit-end:ab12:255\n"], 255, b""),
        ([b"x\x00rlkit-end:ab12:1234\n"], None, None),  # not an exit code
        ([b"x\x00rlkit-end:ab12:7"], None, None),  # no newline: not the stream's end
        ([b"x\x00rlkit-end:ab12:\n"], None, None),
        ([b"x\x00rlkit-end:zz99:7\n"], None, None),  # another request's nonce
        ([b"x\x00rlkit-end:ab12:7\nmore"], None, None),  # output after it: not the end
    ],
)
async def test_a_warm_sandboxs_end_marker_must_end_the_stream(
    chunks: list[bytes], code: int | None, kept: bytes | None
) -> None:
    """The marker (`loader.end_marker`) with this request's nonce and a 1-3 digit code, as the
    stream's last bytes, ends it: the code is kept and the marker cut from the output."""
    stream = asyncio.StreamReader()
    marked: list[int | None] = []
    reader = _CappedReader(stream, 4096, end_prefix("ab12"), lambda: marked.append(reader.code))
    reading = asyncio.ensure_future(reader.run(lambda: None))
    for chunk in chunks:
        stream.feed_data(chunk)
        for _ in range(3):  # the reader takes this chunk alone
            await asyncio.sleep(0)
    stream.feed_eof()
    await reading
    assert reader.code == code
    assert marked == ([] if code is None else [code])
    assert bytes(reader.data) == (kept if kept is not None else b"".join(chunks))
