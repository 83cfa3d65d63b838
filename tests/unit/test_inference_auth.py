"""The inference server's token check, tenants and path confinement (`rlkit.inference.auth`)
on a small ASGI app: the same middleware and helpers the vLLM server installs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.testclient import TestClient

from rlkit.errors import UsageError
from rlkit.inference.auth import RequireToken, install_auth
from rlkit.inference.tenancy import (
    PATH_REFUSED,
    ServerSecurity,
    check_adapter_owner,
    check_path,
    claim_adapter,
    confine,
    no_adapter,
    owns_response,
    request_tag,
)
from rlkit.serving import PathRefused, caller

OWNER, ALICE, BOB = "o" * 32, "a" * 32, "b" * 32


def app_with(security: ServerSecurity, reads: list[str]) -> TestClient:
    app = FastAPI()
    app.state.rlkit_security = security

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.post("/rlkit/update_weights")
    async def update(request: Request) -> dict:
        reads.append((await request.body()).decode())
        check_path(request, (await request.json())["path"])
        return {"caller": caller(request).name}

    @app.get("/rlkit/status")
    async def status(request: Request) -> dict:
        return {"caller": caller(request).name}

    app.add_middleware(RequireToken, security=security)
    return TestClient(app)


@pytest.fixture
def security(tmp_path: Path) -> ServerSecurity:
    (tmp_path / "weights").mkdir()
    return ServerSecurity(OWNER, {"alice": ALICE, "bob": BOB}, roots=[tmp_path / "weights"])


def test_only_liveness_is_open_and_the_body_is_not_read_without_a_token(
    security: ServerSecurity, tmp_path: Path
) -> None:
    reads: list[str] = []
    client = app_with(security, reads)
    assert client.get("/health").status_code == 200
    body = {"path": str(tmp_path / "weights")}
    no_token = client.post("/rlkit/update_weights", json=body)
    assert no_token.status_code == 401 and no_token.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/rlkit/update_weights", json=body, headers=bearer("x" * 32))
    assert wrong.status_code == 403
    basic = client.get("/rlkit/status", headers={"Authorization": f"Basic {OWNER}"})
    assert basic.status_code == 401
    assert reads == []  # refused before the body was read
    assert client.get("/rlkit/status", headers=bearer(OWNER)).json() == {"caller": "owner"}
    assert client.get("/rlkit/status", headers=bearer(ALICE)).json() == {"caller": "alice"}


def test_tenants_cannot_change_the_weights_and_vllms_lora_routes_are_closed(
    security: ServerSecurity, tmp_path: Path
) -> None:
    client = app_with(security, [])
    body = {"path": str(tmp_path / "weights")}
    assert client.post("/rlkit/update_weights", json=body, headers=bearer(ALICE)).status_code == 403
    assert client.post("/rlkit/update_weights", json=body, headers=bearer(OWNER)).status_code == 200
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        assert client.post(path, json={}, headers=bearer(OWNER)).status_code == 404


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_paths_outside_the_roots_get_one_answer_whether_they_exist_or_not(
    security: ServerSecurity, tmp_path: Path
) -> None:
    root = security.roots[0]
    (root / "step_1").mkdir()
    assert confine(root / "step_1", security.roots) == (root / "step_1").resolve()
    assert confine(root / "not-yet", security.roots) == (root / "not-yet").resolve()
    secret = tmp_path / "secret"
    secret.mkdir()
    (root / "link").symlink_to(secret)
    attempts = [
        secret,  # exists
        tmp_path / "nothing-here",  # does not
        root / ".." / "secret",  # `..`
        root / "link",  # a symlink out
        "/etc",
        "relative/path",
        "bad\0path",
    ]
    for path in attempts:
        with pytest.raises(PathRefused) as refused:
            confine(path, security.roots)
        assert str(refused.value) == PATH_REFUSED
    client = app_with(security, [])
    answers = set()
    for p in (secret, tmp_path / "nothing-here"):
        resp = client.post("/rlkit/update_weights", json={"path": str(p)}, headers=bearer(OWNER))
        answers.add((resp.status_code, resp.text))
    assert len(answers) == 1 and next(iter(answers))[0] == 403  # one answer for both
    with pytest.raises(PathRefused):
        confine(root, [])  # a server given no root loads nothing


def test_adapters_belong_to_the_run_that_loaded_them(security: ServerSecurity) -> None:
    alice, bob, owner = (security.identify(t) for t in (ALICE, BOB, OWNER))
    assert alice and bob and owner and owner.owner and not alice.owner
    assert security.identify("z" * 32) is None
    assert security.may_change(alice, "run-a", loaded=False)
    security.adapter_owners["run-a"] = "alice"
    security.adapter_owners["run-b"] = "bob"
    assert not security.may_change(bob, "run-a", loaded=True)
    assert security.may_change(owner, "run-a", loaded=True)
    assert not security.may_change(alice, "preloaded", loaded=True)  # the owner's
    adapters = {"run-a": 1, "run-b": 2, "preloaded": 0}
    assert security.visible(alice, adapters) == {"run-a": 1}
    assert security.visible(bob, adapters) == {"run-b": 2}
    assert security.visible(owner, adapters) == adapters
    assert security.visible(None, adapters) == {}


def test_a_server_never_starts_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.inference.server import server_security
    from rlkit.protocol.credentials import TOKEN_FILE_ENV, write_token_file

    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    with pytest.raises(UsageError, match="no token file"):
        server_security(["--model", "m"])
    token = write_token_file(tmp_path / "token")
    args = ["--model", "m", "--rlkit-token-file", str(tmp_path / "token")]
    with pytest.raises(UsageError, match="--api-key"):
        server_security([*args, "--api-key", "k"])
    (tmp_path / "tenants").mkdir()
    write_token_file(tmp_path / "tenants" / "alice.token", ALICE)
    security, rest = server_security(
        [*args, "--rlkit-tenants-dir", str(tmp_path / "tenants"), "--rlkit-max-update-s", "7",
         "--rlkit-allowed-weights-root", str(tmp_path), "--port", "1"]
    )  # fmt: skip
    assert rest == ["--model", "m", "--port", "1"]
    assert security.owner_token == token and security.tenants == {"alice": ALICE}
    assert security.max_update_s == 7 and security.roots == [tmp_path.resolve()]
    (tmp_path / "tenants" / "alice.token").chmod(0o644)
    with pytest.raises(UsageError, match="other users"):
        server_security([*args, "--rlkit-tenants-dir", str(tmp_path / "tenants")])


def test_rlkit_infer_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.inference.engine_args import security_args
    from rlkit.inference.tenancy import infer_credentials

    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    first = infer_credentials(8000, tenants=["a", "b"])
    assert first.token_file == (tmp_path / "home" / "infer" / "8000" / "token").resolve()
    assert first.tenants_dir == first.token_file.parent / "tenants"
    assert sorted(first.tenant_files) == ["a", "b"]
    files = [first.token_file, *first.tenant_files.values()]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
    again = infer_credentials(8000, tenants=["a"])  # a restart keeps every token
    assert again.token_file.read_text() == first.token_file.read_text()
    assert again.tenant_files["a"].read_text() == first.tenant_files["a"].read_text()
    for bad in ("owner", "../x", ".hidden", ""):
        with pytest.raises(UsageError, match="--tenant"):
            infer_credentials(8000, tenants=[bad])
    args = security_args([tmp_path], first.tenants_dir, 5.0)
    assert first.token_file.read_text().strip() not in " ".join(args)  # paths, never the token


class ServedModels:
    """What vLLM's `openai_serving_models` shows the auth helpers: the adapters."""

    def __init__(self, adapters: list[str]) -> None:
        self.lora_requests = dict.fromkeys(adapters, object())


def tenant_app(security: ServerSecurity, reads: list[bytes]) -> TestClient:
    """A generation route, vLLM's `/metrics` and rlkit's adapter checks behind `install_auth`,
    with adapters `run-a` (alice's), `run-b` (bob's) and `preloaded` (the owner's) served."""
    app = FastAPI()
    app.state.openai_serving_models = ServedModels(["run-a", "run-b", "preloaded"])
    security.adapter_owners.update({"run-a": "alice", "run-b": "bob"})

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        reads.append(await request.body())
        body = await request.json()
        try:  # vLLM listens for the client's disconnect while it answers: none comes yet
            heard = await asyncio.wait_for(request.receive(), 0.05)
            raise AssertionError(f"heard {heard['type']} after the body")
        except TimeoutError:
            pass
        if body["model"] not in ("base", *app.state.openai_serving_models.lora_requests):
            message = f"The model `{body['model']}` does not exist."  # vLLM's words, its type
            return JSONResponse({"error": message, "type": "NotFound"}, status_code=404)
        return {"model": body["model"], "request_id": request.headers.get("x-request-id")}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse('vllm:lora_requests_info{running_lora_adapters="run-a"} 1')

    @app.post("/rlkit/load_adapter")
    async def load(request: Request) -> dict:
        claim_adapter(request, (await request.json())["name"], str(security.roots[0]))
        return {}

    @app.post("/rlkit/unload_adapter")
    async def unload(request: Request) -> dict:
        name = (await request.json())["name"]
        check_adapter_owner(request, name)
        if name not in app.state.openai_serving_models.lora_requests:
            raise no_adapter(name)
        return {}

    install_auth(app, security)
    return TestClient(app)


def test_a_tenant_generates_with_the_base_model_and_its_own_adapters_only(
    security: ServerSecurity,
) -> None:
    reads: list[bytes] = []
    client = tenant_app(security, reads)

    def complete(token: str, model: str, raw: bytes | None = None):
        body = raw or json.dumps({"model": model, "prompt": "x" * 1000}).encode()
        headers = {**bearer(token), "content-type": "application/json"}
        return client.post("/v1/completions", content=body, headers=headers)

    unknown = complete(ALICE, "no-such-model")
    assert unknown.status_code == 404
    for model in ("run-b", "preloaded"):  # bob's, the owner's: as if they did not exist
        resp = complete(ALICE, model)
        assert resp.status_code == 404
        assert resp.json() == json.loads(unknown.text.replace("no-such-model", model))
    # FastAPI reads the last of repeated keys: so does the check
    assert complete(ALICE, "", b'{"model": "run-a", "model": "run-b"}').status_code == 404
    # vLLM never got those names: its answer is for a stand-in that nobody holds
    assert all(b"run-b" not in body and b"preloaded" not in body for body in reads)
    for model in ("base", "run-a"):
        resp = complete(ALICE, model)
        assert resp.status_code == 200 and resp.json()["model"] == model
    assert reads[-1] == json.dumps({"model": "run-a", "prompt": "x" * 1000}).encode()  # intact
    for model in ("run-a", "run-b", "preloaded"):  # the owner may use any
        assert complete(OWNER, model).status_code == 200
    assert complete(BOB, "run-b").status_code == 200 and complete(BOB, "run-a").status_code == 404


def test_metrics_are_the_owners(security: ServerSecurity) -> None:
    client = tenant_app(security, [])
    assert client.get("/metrics", headers=bearer(ALICE)).status_code == 403
    assert "run-a" not in client.get("/metrics", headers=bearer(BOB)).text
    assert "run-a" in client.get("/metrics", headers=bearer(OWNER)).text


def test_another_runs_adapter_name_answers_as_a_name_nobody_holds(
    security: ServerSecurity,
) -> None:
    client = tenant_app(security, [])
    answers = set()
    for route in ("/rlkit/load_adapter", "/rlkit/unload_adapter"):
        for name in ("run-a", "preloaded"):  # alice's, the owner's
            resp = client.post(route, json={"name": name}, headers=bearer(BOB))
            answers.add((resp.status_code, resp.text.replace(name, "NAME")))
    resp = client.post("/rlkit/unload_adapter", json={"name": "nobody"}, headers=bearer(BOB))
    answers.add((resp.status_code, resp.text.replace("nobody", "NAME")))
    assert len(answers) == 1 and next(iter(answers))[0] == 404, answers
    assert client.post(
        "/rlkit/load_adapter", json={"name": "run-b"}, headers=bearer(BOB)
    ).is_success
    assert client.post(
        "/rlkit/load_adapter", json={"name": "fresh"}, headers=bearer(BOB)
    ).is_success
    assert security.adapter_owners["fresh"] == "bob"


def test_a_tenants_request_ids_carry_its_tag_and_only_its_responses_are_its_own(
    security: ServerSecurity,
) -> None:
    client = tenant_app(security, [])
    body = {"model": "base", "prompt": "hi"}
    alice, bob, owner = (security.identify(t) for t in (ALICE, BOB, OWNER))
    assert alice and bob and owner
    ids = {}
    for name, token in (("alice", ALICE), ("bob", BOB)):
        given = {**bearer(token), "X-Request-Id": request_tag("bob") + "posing"}
        for headers in (bearer(token), given):  # a client's own id is kept behind the tag
            rid = client.post("/v1/completions", json=body, headers=headers).json()["request_id"]
            assert rid.startswith(request_tag(name)), rid
            ids.setdefault(name, []).append(f"cmpl-{rid}")
    assert ids["alice"][1].endswith("posing")
    owners_id = client.post("/v1/completions", json=body, headers=bearer(OWNER)).json()
    assert owners_id["request_id"] is None  # the owner's requests are left as they are
    for response_id in ids["alice"]:
        assert owns_response(alice, response_id) and owns_response(owner, response_id)
        assert not owns_response(bob, response_id)
    assert all(owns_response(bob, r) for r in ids["bob"])
    for probe in ("cmpl-", "cmpl", "", request_tag("bob"), f"x{request_tag('bob')}"):
        assert not owns_response(bob, probe)
    assert request_tag("a") != request_tag("a.b") and "-" not in request_tag("a")
