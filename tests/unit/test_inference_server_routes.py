"""The inference server's helpers and routes without vLLM: what a kept prefix cache logs, whose
routing capture a tenant may take."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from rlkit.inference.auth import install_auth
from rlkit.inference.routes import PolicyState, build_router, reset_prefix_cache_or_warn
from rlkit.inference.tenancy import ServerSecurity, request_tag


class Engine:
    def __init__(self, result: bool | Exception) -> None:
        self.result = result
        self.calls = 0

    async def reset_prefix_cache(self) -> bool:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_a_dropped_cache_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(True)
    with caplog.at_level(logging.WARNING, logger="rlkit.inference.server"):
        await reset_prefix_cache_or_warn(engine)
    assert engine.calls == 1 and not caplog.records


@pytest.mark.parametrize(
    ("result", "message"),
    [(False, "old-weight prefixes may be reused"), (RuntimeError("busy"), "reset failed")],
)
async def test_a_kept_cache_is_reported(
    result: bool | Exception, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rlkit.inference.server"):
        await reset_prefix_cache_or_warn(Engine(result))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert message in caplog.records[0].getMessage()


class CapturingEngine:
    """The workers' routing capture as `/rlkit/routing` reaches it: one worker holding the
    routing of each engine request id, handed over (and forgotten) by prefix."""

    def __init__(self, request_ids: list[str]) -> None:
        self.held = dict.fromkeys(request_ids, b"npy")

    async def collective_rpc(self, method: str, args: tuple) -> list[bytes | None]:
        assert method == "rlkit_take_routing"
        found = next((r for r in self.held if r.startswith(args[0])), None)
        return [None if found is None else self.held.pop(found)]


def test_a_tenant_takes_the_routing_of_its_own_responses_only(tmp_path: Path) -> None:
    alice, bob, owner = "a" * 32, "b" * 32, "o" * 32
    security = ServerSecurity(owner, {"alice": alice, "bob": bob}, roots=[tmp_path])
    alices = f"cmpl-{request_tag('alice')}0f3a"
    bobs = f"chatcmpl-{request_tag('bob')}77c1"
    app = FastAPI()
    app.state.rlkit = PolicyState("base", None, routing="capture")
    app.state.rlkit.capture_on = True
    app.state.engine_client = CapturingEngine([f"{alices}-0-1a2b", f"{bobs}-9c8d", "cmpl-42-0"])
    app.include_router(build_router())
    install_auth(app, security)
    client = TestClient(app)

    def take(response_id: str, token: str):
        return client.get(
            f"/rlkit/routing/{response_id}", headers={"Authorization": f"Bearer {token}"}
        )

    unknown = take(f"cmpl-{request_tag('bob')}nothing", bob)
    assert unknown.status_code == 404
    for probe in (alices, "cmpl-", "cmpl-4", "chatcmpl"):  # alice's, any prefix, the owner's
        resp = take(probe, bob)
        assert (resp.status_code, resp.json()) == (404, {"error": f"no routing for {probe}"})
    assert take(bobs, bob).json() == {"routed_experts": base64.b64encode(b"npy").decode()}
    assert take(alices, alice).status_code == 200  # still there: bob's probes took nothing
    assert take("cmpl-42", owner).status_code == 200  # the owner's token sees all
